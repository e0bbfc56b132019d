// RT_CLONES: compile a hot loop for AVX-512, AVX2 and baseline x86-64, picked at load time (the
// build targets baseline x86-64 unless RT_NATIVE). The AVX-512 clone matters for the 16-channel
// blocks: batch norm's 16-float pixel vectors fit one register there (ResNet-20's batch norms,
// forward, 3x faster than in the AVX2 clone).
#pragma once

// The picking runs in an ifunc resolver before the ThreadSanitizer runtime is initialised, and
// instrumented resolvers crash there; TSan builds use the baseline body only. So do clang builds
// (the fuzzing build): clang rejects the AVX2 clone's calls to the inline vector helpers, which
// return 32-byte vectors under the baseline ABI.
#if defined(__SANITIZE_THREAD__) || defined(__clang__)
#define RT_CLONES
#else
#define RT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
