"""Fuzzing of every parser: seeds cut from the committed samples, mutators, and the contract they are held to."""
