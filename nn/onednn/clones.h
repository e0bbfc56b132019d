// RT_CLONES: compile a hot loop for AVX2 and for baseline x86-64, picked at load time (the build
// targets baseline x86-64 unless RT_NATIVE).
#pragma once

// The picking runs in an ifunc resolver before the ThreadSanitizer runtime is initialised, and
// instrumented resolvers crash there; TSan builds use the baseline body only. So do clang builds
// (the fuzzing build): clang rejects the AVX2 clone's calls to the inline vector helpers, which
// return 32-byte vectors under the baseline ABI.
#if defined(__SANITIZE_THREAD__) || defined(__clang__)
#define RT_CLONES
#else
#define RT_CLONES __attribute__((target_clones("avx2", "default")))
#endif
