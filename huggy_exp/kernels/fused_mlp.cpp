// Huggy's whole forward as one C++ kernel (backend `fused`): normalize -> [gemv + bias + SiLU] x N -> mu -> clamp / 3.
// Built by inductor's C++ toolchain (cpp_prefix.h, at::vec::Vectorized, its Python binding) and called without a
// Python wrapper. The shapes are compile-time constants, prepended by huggy_exp/fused.py (DIMS, ACT, WIDTH, NORMALIZE,
// N_LAYERS, CLAMP_ACTIONS, the clamps); one row at a time: it is the batch-1 / control-loop path, not a GEMM.
#include <torch/csrc/inductor/cpp_prefix.h>
using Vec = at::vec::Vectorized<float>;
constexpr int64_t V = Vec::size();

static inline float hsum(Vec v) {
    return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, v);
}

// y = W x + b for W row-major [OUT, IN]: four rows at a time, two accumulators per row (eight FMA chains in flight)
template <int64_t OUT, int64_t IN>
static inline void gemv(const float* __restrict__ W, const float* __restrict__ b, const float* __restrict__ x, float* __restrict__ y) {
    constexpr int64_t KV = IN / (2 * V) * (2 * V);
    int64_t o = 0;
    for (; o + 4 <= OUT; o += 4) {
        const float* w0 = W + o * IN; const float* w1 = w0 + IN; const float* w2 = w1 + IN; const float* w3 = w2 + IN;
        Vec a0(0), a1(0), a2(0), a3(0), c0(0), c1(0), c2(0), c3(0);
        int64_t k = 0;
        for (; k < KV; k += 2 * V) {
            Vec x0 = Vec::loadu(x + k), x1 = Vec::loadu(x + k + V);
            a0 = at::vec::fmadd(Vec::loadu(w0 + k), x0, a0); c0 = at::vec::fmadd(Vec::loadu(w0 + k + V), x1, c0);
            a1 = at::vec::fmadd(Vec::loadu(w1 + k), x0, a1); c1 = at::vec::fmadd(Vec::loadu(w1 + k + V), x1, c1);
            a2 = at::vec::fmadd(Vec::loadu(w2 + k), x0, a2); c2 = at::vec::fmadd(Vec::loadu(w2 + k + V), x1, c2);
            a3 = at::vec::fmadd(Vec::loadu(w3 + k), x0, a3); c3 = at::vec::fmadd(Vec::loadu(w3 + k + V), x1, c3);
        }
        for (; k < IN; k += V) {
            const int64_t n = IN - k < V ? IN - k : V;
            Vec xk = Vec::loadu(x + k, n);
            a0 = at::vec::fmadd(Vec::loadu(w0 + k, n), xk, a0); a1 = at::vec::fmadd(Vec::loadu(w1 + k, n), xk, a1);
            a2 = at::vec::fmadd(Vec::loadu(w2 + k, n), xk, a2); a3 = at::vec::fmadd(Vec::loadu(w3 + k, n), xk, a3);
        }
        y[o] = hsum(a0 + c0) + b[o]; y[o + 1] = hsum(a1 + c1) + b[o + 1];
        y[o + 2] = hsum(a2 + c2) + b[o + 2]; y[o + 3] = hsum(a3 + c3) + b[o + 3];
    }
    for (; o < OUT; ++o) {
        const float* w0 = W + o * IN;
        Vec a0(0), c0(0);
        int64_t k = 0;
        for (; k < KV; k += 2 * V) {
            a0 = at::vec::fmadd(Vec::loadu(w0 + k), Vec::loadu(x + k), a0);
            c0 = at::vec::fmadd(Vec::loadu(w0 + k + V), Vec::loadu(x + k + V), c0);
        }
        for (; k < IN; k += V) {
            const int64_t n = IN - k < V ? IN - k : V;
            a0 = at::vec::fmadd(Vec::loadu(w0 + k, n), Vec::loadu(x + k, n), a0);
        }
        y[o] = hsum(a0 + c0) + b[o];
    }
}

template <int64_t N>
static inline void silu(float* y) {  // y * sigmoid(y), spelled as inductor spells it
    for (int64_t i = 0; i < N; i += V) {
        const int64_t n = N - i < V ? N - i : V;
        Vec v = Vec::loadu(y + i, n);
        Vec s = Vec(1) / (Vec(1) + v.neg().exp());
        (v * s).store(y + i, n);
    }
}

template <int64_t I, int64_t L>
static inline void layers(const float* const* W, const float* const* B, float*& x, float*& y) {
    if constexpr (I < L) {
        gemv<DIMS[I + 1], DIMS[I]>(W[I], B[I], x, y);
        silu<DIMS[I + 1]>(y);
        float* t = x; x = y; y = t;
        layers<I + 1, L>(W, B, x, y);
    }
}

extern "C" void kernel(const float* obs, float* out, const float* mean, const float* stdev, @PARAMS@,
                       const float* mu_w, const float* mu_b, int64_t rows) {
    alignas(64) float buf0[WIDTH + 64], buf1[WIDTH + 64], mu[ACT + 64];
    const float* W[] = {@WS@};
    const float* B[] = {@BS@};
    for (int64_t r = 0; r < rows; ++r) {
        const float* o = obs + r * DIMS[0];
        float* x = buf0; float* y = buf1;
        for (int64_t i = 0; i < DIMS[0]; i += V) {
            const int64_t n = DIMS[0] - i < V ? DIMS[0] - i : V;
            Vec v = Vec::loadu(o + i, n);
            if constexpr (NORMALIZE) {
                v = at::vec::clamp((v - Vec::loadu(mean + i, n)) / Vec::loadu(stdev + i, n), Vec(-NORM_CLAMP), Vec(NORM_CLAMP));
            }
            v.store(x + i, n);
        }
        layers<0, N_LAYERS>(W, B, x, y);
        gemv<ACT, DIMS[N_LAYERS]>(mu_w, mu_b, x, mu);
        float* a = out + r * ACT;
        for (int64_t i = 0; i < ACT; i += V) {  // PPO: clamp(mu, -3, 3) / 3; SAC exports its raw mu
            const int64_t n = ACT - i < V ? ACT - i : V;
            Vec m = Vec::loadu(mu + i, n);
            if constexpr (CLAMP_ACTIONS) {
                m = at::vec::clamp(m, Vec(-ACT_CLAMP), Vec(ACT_CLAMP)) / Vec(ACT_CLAMP);
            }
            m.store(a + i, n);
        }
    }
}
