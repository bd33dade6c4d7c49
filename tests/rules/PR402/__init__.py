"""PR402 gemm-wave-quantization fixtures."""
