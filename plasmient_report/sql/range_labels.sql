-- Module: range_labels
-- The ranges asked for (filled by the measure stage): each `--range` pattern, or each top-level range name with
-- `#N` folded to `#*` when none is given, with the range names it matches — exactly first, then as a glob
-- (`[param|cuda]` is a real range name, not a character class).

CREATE OR REPLACE TABLE range_labels (
    label  VARCHAR,
    name   VARCHAR,
    is_window BOOLEAN
);
COMMENT ON TABLE range_labels IS 'One row per (label, matching range name)';
COMMENT ON COLUMN range_labels.label IS 'the --range pattern, or the top-level range name (#N folded to #*)';
COMMENT ON COLUMN range_labels.name IS 'a ranges.name it matches';
COMMENT ON COLUMN range_labels.is_window IS 'true when the label is an analysis window (false: only its occurrences are needed, for --model-flops per step)';
