"""PR401 matmul-without-tensor-cores fixtures."""
