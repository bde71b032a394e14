/*
 * isa_hw_best: the best CPU backend ISA index this CPU has (0 scalar, 1 AVX2 +
 * FMA, 2 AVX-512F, as be_cpu_isa), asked of the compiler's runtime, not of
 * be_cpu_isa_detect() (the code the CPU backend's tests check). Tests only.
 */
#ifndef TEST_ISA_HW_H
#define TEST_ISA_HW_H

static inline int
isa_hw_best(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
        return 0;
    return __builtin_cpu_supports("avx512f") ? 2 : 1;
#else
    return 0;
#endif
}

#endif /* TEST_ISA_HW_H */
