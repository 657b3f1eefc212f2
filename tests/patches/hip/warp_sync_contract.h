// Test-only: the __shfl*_sync contract of ROCm >= 6.3 HIP headers (6.2 with HIP_ENABLE_WARP_SYNC_BUILTINS,
// which torch's extension build defines), for compile checks with Debian's older hipcc (ROCm 5.2), whose
// headers have no *_sync shuffles. ROCm's versions reject any mask that is not a 64-bit integer:
//   static assertion failed due to requirement 'sizeof(unsigned int) == 8': The mask must be a 64-bit
//   integer. Implicitly promoting a smaller integer is almost always an error.
// (deepspeedai/DeepSpeed#7565, #7590). Only that compile-time contract is modelled; the shuffles forward
// to the mask-less HIP 5.2 intrinsics. Force-included with `-include`.
#pragma once
#include <hip/hip_runtime.h>

#include <type_traits>

#define MLSTACK_REQUIRE_64BIT_MASK(MaskT)                                                   \
    static_assert(std::is_integral<MaskT>::value && sizeof(MaskT) == 8,                     \
                  "The mask must be a 64-bit integer. "                                     \
                  "Implicitly promoting a smaller integer is almost always an error.")

template <typename MaskT, typename T>
__device__ inline T __shfl_sync(MaskT mask, T var, int src_lane, int width = warpSize)
{
    MLSTACK_REQUIRE_64BIT_MASK(MaskT);
    return __shfl(var, src_lane, width);
}

template <typename MaskT, typename T>
__device__ inline T __shfl_up_sync(MaskT mask, T var, unsigned int delta, int width = warpSize)
{
    MLSTACK_REQUIRE_64BIT_MASK(MaskT);
    return __shfl_up(var, delta, width);
}

template <typename MaskT, typename T>
__device__ inline T __shfl_down_sync(MaskT mask, T var, unsigned int delta, int width = warpSize)
{
    MLSTACK_REQUIRE_64BIT_MASK(MaskT);
    return __shfl_down(var, delta, width);
}

template <typename MaskT, typename T>
__device__ inline T __shfl_xor_sync(MaskT mask, T var, int lane_mask, int width = warpSize)
{
    MLSTACK_REQUIRE_64BIT_MASK(MaskT);
    return __shfl_xor(var, lane_mask, width);
}
