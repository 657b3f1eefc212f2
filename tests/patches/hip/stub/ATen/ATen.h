// Test-only stand-in for <ATen/ATen.h>: the CPU torch wheel's ATen headers cannot be compiled for a HIP
// device here (they need rocThrust). type_shim.h only uses ATen in its host-side DISPATCH_* macros, which
// the probes do not expand; the device functions under test need nothing from it.
#pragma once
