"""Host-side tools that run the Triton kernels from Python, under Triton's JIT (or its
interpreter on a CPU): launch.py launches them with the arguments the C++ ops pass, and the
tuners search their tile configs on a GPU (tune.py the attention tiles, tune_tile_loop.py the
length from which the looping forward is asked for, tune_decode.py the decode tiles and splits).

The tuners write what they choose into aot_build/tuned/, which the build reads as data. This
package is a development tool: neither the build (aot_build) nor the runtime (python/fattn)
imports it, and the wheel does not ship it.
"""
