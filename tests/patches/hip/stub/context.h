// Test-only stand-in: general_kernels.h includes this for host-side GPU context / cuBLAS / cuRAND
// declarations that need a ROCm install; the FINAL_MASK probe uses nothing from it.
#pragma once
