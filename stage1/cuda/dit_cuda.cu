/* DiT forward on the GPU (stage1/cuda/dit_cuda.h). */
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "stage1/cuda/dit_cuda.h"
#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/dit_fp8.h"
#include "stage1/cuda/dit_gemm.h"
#include "stage1/cuda/dit_kernels.h"

extern "C" {
#include "common/log.h"
#include "common/ops.h"
}

/* The reference's RoPE base (not in config.json; as stage1/dit.c). */
#define DIT_CUDA_ROPE_THETA 10000.0
#define DIT_CUDA_LN_EPS 1e-5f

struct dit_cuda_layer {
    const void *wqkv;   /* [3*hidden, hidden]: to_q, to_k, to_v stacked */
    const void *wo;     /* [hidden, hidden] */
    const void *ff_in;  /* [2*ff_inner, hidden] */
    const void *ff_out; /* [hidden, ff_inner] */
    const float *norm1_w, *norm1_b, *norm2_w, *norm2_b, *ff_in_b, *ff_out_b;
    /* fp8: the per-output-channel scales of the matrices above stored as e4m3 (NULL: that
     * matrix is fp16, its shape does not fit dit_gemm_fp8_fits) */
    const float *wqkv_s, *wo_s, *ff_in_s, *ff_out_s;
};

struct dit_cuda {
    struct dit_config cfg;
    enum mm3_matmul_precision prec;
    int fmt; /* enum dit_operand: how activations are stored for the GEMMs */
    struct dit_gemm *gemm;
    /* weights */
    const void *t1_w, *t2_w, *pre_w, *proj_in, *proj_out, *post_w;
    const float *t1_b, *t2_b, *time_proj, *inv_freq;
    struct dit_cuda_layer *layers;
    void **allocs;
    int n_allocs, max_allocs;
    /* activations for up to cap_B x cap_L */
    int cap_B, cap_L;
    float *h0, *h1, *x, *qkv, *g, *y, *yp, *tf, *t1, *cs;
    void *op; /* GEMM operand scratch: LayerNorm / attention / gating outputs, conversions */
    uint8_t *q8; /* fp8: e4m3 operand rows of the block GEMMs ... */
    float *qs;   /* ... their scales, one per token row */
    float *att;  /* fp8: the float32 attention output before its quantization */
    int cs_T;
};

static int dev_alloc(struct dit_cuda *h, void **p, size_t bytes)
{
    *p = NULL;
    if (h->n_allocs == h->max_allocs)
        return mm3_errorf(-ENOMEM, "dit_cuda: more than %d weight tensors", h->max_allocs);
    int rc = dit_cuda_status(cudaMalloc(p, bytes ? bytes : 4), "cudaMalloc (DiT weights)");
    if (rc < 0) return rc;
    h->allocs[h->n_allocs++] = *p;
    return 0;
}

static void free_activations(struct dit_cuda *h)
{
    float **f[] = {&h->h0, &h->h1, &h->x, &h->qkv, &h->g, &h->y, &h->yp, &h->tf, &h->t1, &h->cs};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        cudaFree(*f[i]);
        *f[i] = NULL;
    }
    cudaFree(h->op);
    cudaFree(h->q8);
    cudaFree(h->qs);
    cudaFree(h->att);
    h->op = NULL;
    h->q8 = NULL;
    h->qs = h->att = NULL;
    h->cap_B = h->cap_L = 0;
    h->cs_T = 0;
}

extern "C" void dit_cuda_free(struct dit_cuda *h)
{
    if (!h) return;
    free_activations(h);
    for (int i = 0; i < h->n_allocs; i++)
        cudaFree(h->allocs[i]);
    free(h->allocs);
    free(h->layers);
    dit_gemm_destroy(h->gemm);
    free(h);
}

extern "C" const struct dit_config *dit_cuda_config(const struct dit_cuda *h)
{
    return &h->cfg;
}

extern "C" enum mm3_matmul_precision dit_cuda_precision(const struct dit_cuda *h)
{
    return h->prec;
}

extern "C" int dit_cuda_set_rescue(struct dit_cuda *h, int on)
{
    if (h->prec != MM3_MATMUL_FP16 && h->prec != MM3_MATMUL_FP8)
        return on ? mm3_errorf(-EINVAL, "dit_cuda_set_rescue: only an fp16 or fp8 DiT has fp16 operands to rescale")
                  : 0;
    h->fmt = on ? DIT_OPERAND_F16_SCALED : DIT_OPERAND_F16;
    dit_gemm_set_alpha(h->gemm, on ? DIT_F16_RESCUE_SCALE : 1.0f);
    return 0;
}

static int check_config(const struct dit_config *g)
{
    if (g->in_ch < 1 || g->cond_dim < 1 || g->n_layers < 1 || g->n_heads < 1 || g->head_dim < 1 || g->ff_inner < 1 ||
        g->fourier_dim < 2 || g->fourier_dim % 2 || g->rotary_dim < 0 || g->rotary_dim % 2 ||
        g->rotary_dim > g->head_dim)
        return mm3_errorf(-EINVAL, "dit_cuda: transformer config: expected positive sizes, even fourier_dim and an "
                                   "even rotary_dim <= attention_head_dim");
    if (g->head_dim != 8 && g->head_dim != 16 && g->head_dim != 32 && g->head_dim != 64 && g->head_dim != 128)
        return mm3_errorf(-EINVAL, "dit_cuda: attention_head_dim %d: the CUDA attention supports 8, 16, 32, 64 and 128",
                          g->head_dim);
    return 0;
}

/* Handle with the config, GEMM and the weight pointers laid out, nothing uploaded. */
static int create(struct dit_cuda **out, const struct dit_config *cfg, enum mm3_matmul_precision prec)
{
    *out = NULL;
    struct dit_config g = *cfg;
    g.hidden = g.n_heads * g.head_dim;
    g.cat_dim = 2 * g.in_ch + g.cond_dim;
    int rc = check_config(&g);
    if (rc < 0) return rc;
    struct dit_cuda *h = (struct dit_cuda *)calloc(1, sizeof *h);
    if (!h) return mm3_errorf(-ENOMEM, "dit_cuda: out of memory");
    h->cfg = g;
    h->prec = prec;
    h->fmt = dit_operand_of(prec);
    h->max_allocs = 16 + 14 * g.n_layers;
    h->allocs = (void **)calloc((size_t)h->max_allocs, sizeof *h->allocs);
    h->layers = (struct dit_cuda_layer *)calloc((size_t)g.n_layers, sizeof *h->layers);
    if (!h->allocs || !h->layers) {
        dit_cuda_free(h);
        return mm3_errorf(-ENOMEM, "dit_cuda: out of memory");
    }
    if ((rc = dit_gemm_create(&h->gemm, prec)) < 0) {
        dit_cuda_free(h);
        return rc;
    }
    *out = h;
    return 0;
}

/* The weights in one fixed order, so the loaders share a single walk. `mat` makes an
 * operand matrix of rows x cols, `vec` a float32 vector; both fill it from `src`
 * (the CPU tensor, may be NULL for random). `scale` is non-NULL for the block matrices,
 * which an fp8 DiT stores as e4m3 rows (their scales there) where the shape allows. */
struct filler {
    int (*mat)(struct filler *f, const void **dst, const float **scale, size_t rows, size_t cols,
               const float *const *src, int n_src);
    int (*vec)(struct filler *f, const float **dst, size_t n, const float *src, int kind);
    struct dit_cuda *h;
    float *staging; /* float32 device scratch (conversion to 2-byte operands) */
    uint64_t seed;
    int tensor;
};

enum { VEC_BIAS, VEC_NORM_W, VEC_NORM_B, VEC_TIME_PROJ };

static int walk(struct filler *f, const struct dit_model *m)
{
    struct dit_cuda *h = f->h;
    const struct dit_config *g = &h->cfg;
    size_t D = g->hidden, F = g->ff_inner, Cc = g->cat_dim, C = g->in_ch, Fd = g->fourier_dim;
    const struct dit_weights *w = m ? &m->w : NULL;
    int rc;
#define SRC(x) (w ? w->x : NULL)
    {
        const float *s[1] = {SRC(t1_w)};
        if ((rc = f->mat(f, &h->t1_w, NULL, D, Fd, s, 1)) < 0) return rc;
    }
    if ((rc = f->vec(f, &h->t1_b, D, SRC(t1_b), VEC_BIAS)) < 0) return rc;
    {
        const float *s[1] = {SRC(t2_w)};
        if ((rc = f->mat(f, &h->t2_w, NULL, D, D, s, 1)) < 0) return rc;
    }
    if ((rc = f->vec(f, &h->t2_b, D, SRC(t2_b), VEC_BIAS)) < 0) return rc;
    if ((rc = f->vec(f, &h->time_proj, Fd / 2, SRC(time_proj), VEC_TIME_PROJ)) < 0) return rc;
    {
        const float *s[1] = {SRC(pre_w)};
        if ((rc = f->mat(f, &h->pre_w, NULL, Cc, Cc, s, 1)) < 0) return rc;
    }
    {
        const float *s[1] = {SRC(proj_in)};
        if ((rc = f->mat(f, &h->proj_in, NULL, D, Cc, s, 1)) < 0) return rc;
    }
    {
        const float *s[1] = {SRC(proj_out)};
        if ((rc = f->mat(f, &h->proj_out, NULL, C, D, s, 1)) < 0) return rc;
    }
    {
        const float *s[1] = {SRC(post_w)};
        if ((rc = f->mat(f, &h->post_w, NULL, C, C, s, 1)) < 0) return rc;
    }
#undef SRC
    for (int i = 0; i < g->n_layers; i++) {
        struct dit_cuda_layer *l = &h->layers[i];
        const struct dit_layer *c = w ? &w->layers[i] : NULL;
#define LS(x) (c ? c->x : NULL)
        if ((rc = f->vec(f, &l->norm1_w, D, LS(norm1_w), VEC_NORM_W)) < 0) return rc;
        if ((rc = f->vec(f, &l->norm1_b, D, LS(norm1_b), VEC_NORM_B)) < 0) return rc;
        {
            const float *s[3] = {LS(wq), LS(wk), LS(wv)};
            if ((rc = f->mat(f, &l->wqkv, &l->wqkv_s, 3 * D, D, s, 3)) < 0) return rc;
        }
        {
            const float *s[1] = {LS(wo)};
            if ((rc = f->mat(f, &l->wo, &l->wo_s, D, D, s, 1)) < 0) return rc;
        }
        if ((rc = f->vec(f, &l->norm2_w, D, LS(norm2_w), VEC_NORM_W)) < 0) return rc;
        if ((rc = f->vec(f, &l->norm2_b, D, LS(norm2_b), VEC_NORM_B)) < 0) return rc;
        {
            const float *s[1] = {LS(ff_in_w)};
            if ((rc = f->mat(f, &l->ff_in, &l->ff_in_s, 2 * F, D, s, 1)) < 0) return rc;
        }
        if ((rc = f->vec(f, &l->ff_in_b, 2 * F, LS(ff_in_b), VEC_BIAS)) < 0) return rc;
        {
            const float *s[1] = {LS(ff_out_w)};
            if ((rc = f->mat(f, &l->ff_out, &l->ff_out_s, D, F, s, 1)) < 0) return rc;
        }
        if ((rc = f->vec(f, &l->ff_out_b, D, LS(ff_out_b), VEC_BIAS)) < 0) return rc;
#undef LS
    }
    return 0;
}

/* ---- upload from the CPU model ------------------------------------------------------ */

/* fp16 holds magnitudes up to 65504: a weight beyond it would become inf in every product. */
static int check_f16_range(const float *w, size_t n, size_t rows, size_t cols)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(w[i]) <= 65504.0f))
            return mm3_errorf(-ERANGE,
                              "a %zu x %zu weight matrix holds %g at element %zu, beyond fp16's range (65504): "
                              "use matmul_precision tf32 or bf16 for this checkpoint",
                              rows, cols, (double)w[i], i);
    return 0;
}

/* Whether an fp8 DiT stores this block matrix (w[rows, cols], an activation row of cols
 * in, rows out) as e4m3: the GEMM's K = cols, N = rows, lda = K, ldd = N. */
static bool fp8_matrix(const struct dit_cuda *h, const float **scale, size_t rows, size_t cols)
{
    return h->prec == MM3_MATMUL_FP8 && scale && dit_gemm_fp8_fits((int)cols, (int)rows, (int)cols, (int)rows);
}

/* The e4m3 rows and per-row scales of the float32 matrix in f->staging. */
static int fp8_from_staging(struct filler *f, const void **dst, const float **scale, size_t rows, size_t cols)
{
    struct dit_cuda *h = f->h;
    void *p, *sc;
    int rc = dev_alloc(h, &p, rows * cols);
    if (rc == 0) rc = dev_alloc(h, &sc, rows * 4);
    if (rc < 0) return rc;
    *dst = p;
    *scale = (const float *)sc;
    return dit_fp8_quantize_rows((uint8_t *)p, (float *)sc, f->staging, (int)rows, (int)cols, (int)cols, NULL);
}

static int check_finite(const float *w, size_t n, size_t rows, size_t cols)
{
    for (size_t i = 0; i < n; i++)
        if (!std::isfinite(w[i]))
            return mm3_errorf(-ERANGE, "a %zu x %zu weight matrix holds %g at element %zu: expected finite weights",
                              rows, cols, (double)w[i], i);
    return 0;
}

static int upload_mat(struct filler *f, const void **dst, const float **scale, size_t rows, size_t cols,
                      const float *const *src, int n_src)
{
    struct dit_cuda *h = f->h;
    void *p;
    if (fp8_matrix(h, scale, rows, cols)) {
        size_t per = rows * cols / (size_t)n_src;
        int rc = 0;
        for (int s = 0; s < n_src && rc == 0; s++) {
            rc = check_finite(src[s], per, rows, cols);
            if (rc == 0)
                rc = dit_cuda_status(cudaMemcpy(f->staging + s * per, src[s], per * 4, cudaMemcpyHostToDevice),
                                     "cudaMemcpy (weights)");
        }
        return rc < 0 ? rc : fp8_from_staging(f, dst, scale, rows, cols);
    }
    size_t n = rows * cols, per = n / (size_t)n_src;
    int rc = dev_alloc(h, &p, n * dit_gemm_operand_size(h->prec));
    if (rc < 0) return rc;
    for (int s = 0; s < n_src && rc == 0; s++) {
        if (h->fmt == DIT_OPERAND_F16) rc = check_f16_range(src[s], per, rows, cols);
        if (rc < 0) break;
        if (h->fmt != DIT_OPERAND_F32) {
            rc = dit_cuda_status(cudaMemcpy(f->staging, src[s], per * 4, cudaMemcpyHostToDevice),
                                 "cudaMemcpy (weights)");
            if (rc == 0) rc = dit_cuda_to_operand((uint16_t *)p + s * per, h->fmt, f->staging, per, NULL);
        } else {
            rc = dit_cuda_status(cudaMemcpy((float *)p + s * per, src[s], per * 4, cudaMemcpyHostToDevice),
                                 "cudaMemcpy (weights)");
        }
    }
    *dst = p;
    return rc;
}

static int upload_vec(struct filler *f, const float **dst, size_t n, const float *src, int kind)
{
    void *p;
    int rc = dev_alloc(f->h, &p, n * 4);
    if (rc < 0) return rc;
    *dst = (const float *)p;
    return dit_cuda_status(cudaMemcpy(p, src, n * 4, cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
}

static size_t largest_matrix(const struct dit_config *g)
{
    size_t D = g->hidden, F = g->ff_inner, Cc = g->cat_dim, Fd = g->fourier_dim;
    size_t a[] = {3 * D * D, 2 * F * D, Cc * Cc, D * Cc, D * Fd, D * D};
    size_t mx = 0;
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (a[i] > mx) mx = a[i];
    return mx;
}

static int finish_load(struct dit_cuda *h, int rc)
{
    if (rc == 0) {
        /* inv_freq as the CPU computes it (the exact torch table) */
        int half = h->cfg.rotary_dim / 2;
        float *inv = (float *)malloc(sizeof(float) * (size_t)(half + 1));
        void *p = NULL;
        if (!inv) rc = mm3_errorf(-ENOMEM, "dit_cuda: out of memory");
        if (rc == 0 && half > 0) op_rope_inv_freq(inv, DIT_CUDA_ROPE_THETA, h->cfg.rotary_dim);
        if (rc == 0) rc = dev_alloc(h, &p, sizeof(float) * (size_t)(half + 1));
        if (rc == 0 && half > 0)
            rc = dit_cuda_status(cudaMemcpy(p, inv, sizeof(float) * half, cudaMemcpyHostToDevice), "cudaMemcpy");
        h->inv_freq = (const float *)p;
        free(inv);
    }
    if (rc == 0) rc = dit_cuda_status(cudaDeviceSynchronize(), "loading the DiT");
    if (rc == 0 && h->prec == MM3_MATMUL_FP8) {
        const struct dit_cuda_layer *l = &h->layers[0];
        if (!l->wqkv_s || !l->wo_s || !l->ff_in_s || !l->ff_out_s)
            LOG_INFO("fp8 DiT: hidden %d, ff_inner %d: the block matrices whose sizes are not multiples of 16 run in "
                     "fp16 (qkv %s, out %s, ff_in %s, ff_out %s)",
                     h->cfg.hidden, h->cfg.ff_inner, l->wqkv_s ? "fp8" : "fp16", l->wo_s ? "fp8" : "fp16",
                     l->ff_in_s ? "fp8" : "fp16", l->ff_out_s ? "fp8" : "fp16");
    }
    return rc;
}

extern "C" int dit_cuda_load(struct dit_cuda **out, const struct dit_model *m, enum mm3_matmul_precision prec)
{
    *out = NULL;
    struct dit_cuda *h;
    int rc = create(&h, &m->cfg, prec);
    if (rc < 0) return rc;
    struct filler f;
    memset(&f, 0, sizeof f);
    f.mat = upload_mat;
    f.vec = upload_vec;
    f.h = h;
    if (h->fmt != DIT_OPERAND_F32)
        rc = dit_cuda_status(cudaMalloc((void **)&f.staging, largest_matrix(&h->cfg) * 4), "cudaMalloc (staging)");
    if (rc == 0) rc = walk(&f, m);
    rc = finish_load(h, rc);
    cudaFree(f.staging);
    if (rc < 0) {
        dit_cuda_free(h);
        return mm3_error_prefix(rc, "uploading the DiT: ");
    }
    *out = h;
    return 0;
}

/* ---- random weights on the device --------------------------------------------------- */

__device__ __forceinline__ float hash_uniform(uint64_t seed, size_t i)
{
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; /* [-1, 1) */
}

__global__ void fill_random_kernel(void *dst, int fmt, size_t n, uint64_t seed, float scale, float offset)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dit_store_operand(dst, e, offset + scale * hash_uniform(seed, e), fmt);
}

static uint64_t tensor_seed(struct filler *f)
{
    return f->seed * 0x100000001b3ull + (uint64_t)(f->tensor++) * 0x9e3779b97f4a7c15ull;
}

static int random_mat(struct filler *f, const void **dst, const float **scale, size_t rows, size_t cols,
                      const float *const *src, int n_src)
{
    struct dit_cuda *h = f->h;
    void *p;
    size_t n = rows * cols;
    if (fp8_matrix(h, scale, rows, cols)) {
        fill_random_kernel<<<dit_cuda_blocks(n, 256), 256>>>(f->staging, DIT_OPERAND_F32, n, tensor_seed(f),
                                                             1.0f / sqrtf((float)cols), 0.0f);
        int rc = dit_cuda_launched("fill_random_kernel");
        return rc < 0 ? rc : fp8_from_staging(f, dst, scale, rows, cols);
    }
    int rc = dev_alloc(h, &p, n * dit_gemm_operand_size(h->prec));
    if (rc < 0) return rc;
    *dst = p;
    fill_random_kernel<<<dit_cuda_blocks(n, 256), 256>>>(p, h->fmt, n, tensor_seed(f), 1.0f / sqrtf((float)cols),
                                                         0.0f);
    return dit_cuda_launched("fill_random_kernel");
}

static int random_vec(struct filler *f, const float **dst, size_t n, const float *src, int kind)
{
    void *p;
    int rc = dev_alloc(f->h, &p, n * 4);
    if (rc < 0) return rc;
    *dst = (const float *)p;
    float scale = kind == VEC_NORM_W ? 0.1f : kind == VEC_TIME_PROJ ? 1.0f : 0.02f;
    float offset = kind == VEC_NORM_W ? 1.0f : 0.0f;
    fill_random_kernel<<<dit_cuda_blocks(n, 256), 256>>>(p, DIT_OPERAND_F32, n, tensor_seed(f), scale, offset);
    return dit_cuda_launched("fill_random_kernel");
}

extern "C" int dit_cuda_load_random(struct dit_cuda **out, const struct dit_config *cfg, enum mm3_matmul_precision prec,
                                    uint64_t seed)
{
    *out = NULL;
    struct dit_cuda *h;
    int rc = create(&h, cfg, prec);
    if (rc < 0) return rc;
    struct filler f;
    memset(&f, 0, sizeof f);
    f.mat = random_mat;
    f.vec = random_vec;
    f.h = h;
    f.seed = seed;
    if (prec == MM3_MATMUL_FP8)
        rc = dit_cuda_status(cudaMalloc((void **)&f.staging, largest_matrix(&h->cfg) * 4), "cudaMalloc (staging)");
    if (rc == 0) rc = walk(&f, NULL);
    rc = finish_load(h, rc);
    cudaFree(f.staging);
    if (rc < 0) {
        dit_cuda_free(h);
        return mm3_error_prefix(rc, "random DiT: ");
    }
    *out = h;
    return 0;
}

/* ---- activations ------------------------------------------------------------------------ */

extern "C" int dit_cuda_reserve(struct dit_cuda *h, int max_B, int max_L)
{
    if (max_B < 1 || max_L < 1)
        return mm3_errorf(-EINVAL, "dit_cuda_reserve: %d x %d: expected positive sizes", max_B, max_L);
    if (max_B <= h->cap_B && max_L <= h->cap_L) return 0;
    if (max_B < h->cap_B) max_B = h->cap_B;
    if (max_L < h->cap_L) max_L = h->cap_L;
    int rc = dit_cuda_status(cudaDeviceSynchronize(), "dit_cuda_reserve");
    if (rc < 0) return rc;
    free_activations(h);
    const struct dit_config *g = &h->cfg;
    size_t B = max_B, L = max_L, T = L + 1, N = B * T;
    size_t D = g->hidden, F = g->ff_inner, Cc = g->cat_dim, C = g->in_ch;
    size_t op = N * (D > F ? D : F);
    if (B * L * Cc > op) op = B * L * Cc;
    if (B * g->fourier_dim > op) op = B * g->fourier_dim;
    struct {
        float **p;
        size_t n;
    } a[] = {{&h->h0, B * L * Cc}, {&h->h1, B * L * Cc},
             {&h->x, N * D},       {&h->qkv, N * 3 * D},
             {&h->g, N * 2 * F},   {&h->y, B * L * C},
             {&h->yp, B * L * C},  {&h->tf, B * g->fourier_dim},
             {&h->t1, B * D},      {&h->cs, T * (g->rotary_dim ? g->rotary_dim : 1)}};
    for (size_t i = 0; i < sizeof a / sizeof a[0] && rc == 0; i++)
        rc = dit_cuda_status(cudaMalloc((void **)a[i].p, a[i].n * 4), "cudaMalloc (DiT activations)");
    if (rc == 0)
        rc = dit_cuda_status(cudaMalloc(&h->op, op * dit_gemm_operand_size(h->prec)), "cudaMalloc (DiT operands)");
    if (rc == 0 && h->prec == MM3_MATMUL_FP8) {
        rc = dit_cuda_status(cudaMalloc((void **)&h->q8, N * (D > F ? D : F)), "cudaMalloc (DiT fp8 operands)");
        if (rc == 0) rc = dit_cuda_status(cudaMalloc((void **)&h->qs, N * 4), "cudaMalloc (DiT fp8 scales)");
        if (rc == 0) rc = dit_cuda_status(cudaMalloc((void **)&h->att, N * D * 4), "cudaMalloc (DiT attention)");
    }
    if (rc < 0) {
        free_activations(h);
        return rc;
    }
    h->cap_B = max_B, h->cap_L = max_L;
    return 0;
}

/* ---- forward ----------------------------------------------------------------------------- */

/* The GEMM operand for float32 activations: themselves, or their copy in h->op. */
static int operand(struct dit_cuda *h, const void **out, const float *src, size_t n, cudaStream_t s)
{
    if (h->fmt == DIT_OPERAND_F32) {
        *out = src;
        return 0;
    }
    *out = h->op;
    return dit_cuda_to_operand(h->op, h->fmt, src, n, s);
}

static const void *op_at(const struct dit_cuda *h, const void *base, size_t elems)
{
    return (const char *)base + elems * dit_gemm_operand_size(h->prec);
}

extern "C" int dit_cuda_forward(struct dit_cuda *h, int B, int L, const float *x, const float *t,
                                const float *const *cond, float *v, void *stream)
{
    if (B < 1 || L < 1 || !x || !t || !v)
        return mm3_errorf(-EINVAL, "dit_cuda_forward: %d sequences of %d latents: expected positive sizes", B, L);
    int rc = dit_cuda_reserve(h, B, L);
    if (rc < 0) return rc;
    const struct dit_config *g = &h->cfg;
    cudaStream_t s = (cudaStream_t)stream;
    int T = L + 1, N = B * T, D = g->hidden, F = g->ff_inner, Cc = g->cat_dim, C = g->in_ch, Fd = g->fourier_dim;
    int BL = B * L;
    int ob = h->fmt;
    const void *a;
#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        if ((rc = (call)) < 0) return mm3_error_prefix(rc, "dit_cuda_forward: ");                                      \
    } while (0)

    if (g->rotary_dim > 0 && h->cs_T != T) {
        TRY(dit_cuda_rope_table(h->cs, h->inv_freq, T, g->rotary_dim, s));
        h->cs_T = T;
    }

    /* 1. [x, zeros, cond] rows, residual 1x1 conv, proj_in into token rows 1..L */
    for (int b = 0; b < B; b++)
        TRY(dit_cuda_embed_input(h->h0 + (size_t)b * L * Cc, x + (size_t)b * C * L, cond ? cond[b] : NULL, L, C,
                                 g->cond_dim, s));
    TRY(operand(h, &a, h->h0, (size_t)BL * Cc, s));
    const struct dit_gemm_product pre = {
        .d = h->h1, .a = a, .w = h->pre_w, .c = h->h0, .M = BL, .K = Cc, .N = Cc, .lda = Cc, .ldd = Cc};
    TRY(dit_gemm_run(h->gemm, &pre, s));
    TRY(operand(h, &a, h->h1, (size_t)BL * Cc, s));
    for (int b = 0; b < B; b++) {
        const struct dit_gemm_product proj_in = {.d = h->x + ((size_t)b * T + 1) * D,
                                                 .a = op_at(h, a, (size_t)b * L * Cc),
                                                 .w = h->proj_in,
                                                 .M = L,
                                                 .K = Cc,
                                                 .N = D,
                                                 .lda = Cc,
                                                 .ldd = D};
        TRY(dit_gemm_run(h->gemm, &proj_in, s));
    }

    /* 2. time token in row 0 of each sequence */
    TRY(dit_cuda_time_features(h->tf, t, h->time_proj, B, Fd, s));
    TRY(operand(h, &a, h->tf, (size_t)B * Fd, s));
    const struct dit_gemm_product t1 = {
        .d = h->t1, .a = a, .w = h->t1_w, .bias = h->t1_b, .M = B, .K = Fd, .N = D, .lda = Fd, .ldd = D};
    TRY(dit_gemm_run(h->gemm, &t1, s));
    TRY(dit_cuda_silu(h->op, ob, h->t1, (size_t)B * D, s));
    const struct dit_gemm_product t2 = {
        .d = h->x, .a = h->op, .w = h->t2_w, .bias = h->t2_b, .M = B, .K = D, .N = D, .lda = D, .ldd = T * D};
    TRY(dit_gemm_run(h->gemm, &t2, s));

    /* 3. blocks: residual adds ride on the GEMMs (C = D = x). An fp8 DiT's block matrices
     * with e4m3 rows (l->*_s) read e4m3 token rows with their scales (h->q8, h->qs); its
     * attention computes in fp16 (in tf32 when rerun with scaled operands: as fp16's, which
     * tells its attention by the scaled operand type). */
    float scale = 1.0f / sqrtf((float)g->head_dim);
    enum mm3_matmul_precision attn_prec = h->prec != MM3_MATMUL_FP8      ? h->prec
                                          : ob == DIT_OPERAND_F16_SCALED ? MM3_MATMUL_TF32
                                                                         : MM3_MATMUL_FP16;
    const struct dit_heads heads = {
        .n_seq = B, .T = T, .n_heads = g->n_heads, .head_dim = g->head_dim, .rotary_dim = g->rotary_dim};
    for (int i = 0; i < g->n_layers; i++) {
        const struct dit_cuda_layer *l = &h->layers[i];
        const uint8_t *q8 = h->q8;
        const struct dit_layernorm norm1 = {
            .x = h->x, .w = l->norm1_w, .b = l->norm1_b, .n = N, .dim = D, .eps = DIT_CUDA_LN_EPS};
        const struct dit_layernorm norm2 = {
            .x = h->x, .w = l->norm2_w, .b = l->norm2_b, .n = N, .dim = D, .eps = DIT_CUDA_LN_EPS};
        if (l->wqkv_s) {
            TRY(dit_fp8_layernorm(h->q8, h->qs, &norm1, s));
            const struct dit_gemm_product qkv = {.d = h->qkv,
                                                 .a = q8,
                                                 .w = (const uint8_t *)l->wqkv,
                                                 .sa = h->qs,
                                                 .sw = l->wqkv_s,
                                                 .M = N,
                                                 .K = D,
                                                 .N = 3 * D,
                                                 .lda = D,
                                                 .ldd = 3 * D};
            TRY(dit_gemm_run_fp8(h->gemm, &qkv, s));
        } else {
            TRY(dit_cuda_layernorm(h->op, ob, &norm1, s));
            const struct dit_gemm_product qkv = {
                .d = h->qkv, .a = h->op, .w = l->wqkv, .M = N, .K = D, .N = 3 * D, .lda = D, .ldd = 3 * D};
            TRY(dit_gemm_run(h->gemm, &qkv, s));
        }
        if (l->wo_s) {
            const struct dit_attention att = {.out = h->att,
                                              .out_fmt = DIT_OPERAND_F32,
                                              .qkv = h->qkv,
                                              .heads = heads,
                                              .cs = g->rotary_dim ? h->cs : NULL,
                                              .scale = scale,
                                              .prec = attn_prec};
            TRY(dit_cuda_attention(&att, s));
            TRY(dit_fp8_quantize_rows(h->q8, h->qs, h->att, N, D, D, s));
            const struct dit_gemm_product wo = {.d = h->x,
                                                .a = q8,
                                                .w = (const uint8_t *)l->wo,
                                                .sa = h->qs,
                                                .sw = l->wo_s,
                                                .c = h->x,
                                                .M = N,
                                                .K = D,
                                                .N = D,
                                                .lda = D,
                                                .ldd = D};
            TRY(dit_gemm_run_fp8(h->gemm, &wo, s));
        } else {
            const struct dit_attention att = {.out = h->op,
                                              .out_fmt = ob,
                                              .qkv = h->qkv,
                                              .heads = heads,
                                              .cs = g->rotary_dim ? h->cs : NULL,
                                              .scale = scale,
                                              .prec = attn_prec};
            TRY(dit_cuda_attention(&att, s));
            const struct dit_gemm_product wo = {
                .d = h->x, .a = h->op, .w = l->wo, .c = h->x, .M = N, .K = D, .N = D, .lda = D, .ldd = D};
            TRY(dit_gemm_run(h->gemm, &wo, s));
        }
        /* fp8 gating adds ff_in's bias as it reads g (no pass of its own) */
        const float *gate_bias = l->ff_out_s ? l->ff_in_b : NULL;
        if (l->ff_in_s) {
            TRY(dit_fp8_layernorm(h->q8, h->qs, &norm2, s));
            const struct dit_gemm_product ff_in = {.d = h->g,
                                                   .a = q8,
                                                   .w = (const uint8_t *)l->ff_in,
                                                   .sa = h->qs,
                                                   .sw = l->ff_in_s,
                                                   .bias = gate_bias ? NULL : l->ff_in_b,
                                                   .M = N,
                                                   .K = D,
                                                   .N = 2 * F,
                                                   .lda = D,
                                                   .ldd = 2 * F};
            TRY(dit_gemm_run_fp8(h->gemm, &ff_in, s));
        } else {
            TRY(dit_cuda_layernorm(h->op, ob, &norm2, s));
            const struct dit_gemm_product ff_in = {.d = h->g,
                                                   .a = h->op,
                                                   .w = l->ff_in,
                                                   .bias = gate_bias ? NULL : l->ff_in_b,
                                                   .M = N,
                                                   .K = D,
                                                   .N = 2 * F,
                                                   .lda = D,
                                                   .ldd = 2 * F};
            TRY(dit_gemm_run(h->gemm, &ff_in, s));
        }
        if (l->ff_out_s) {
            TRY(dit_fp8_silu_gate(h->q8, h->qs, h->g, gate_bias, N, F, s));
            const struct dit_gemm_product ff_out = {.d = h->x,
                                                    .a = q8,
                                                    .w = (const uint8_t *)l->ff_out,
                                                    .sa = h->qs,
                                                    .sw = l->ff_out_s,
                                                    .bias = l->ff_out_b,
                                                    .c = h->x,
                                                    .M = N,
                                                    .K = F,
                                                    .N = D,
                                                    .lda = F,
                                                    .ldd = D};
            TRY(dit_gemm_run_fp8(h->gemm, &ff_out, s));
        } else {
            TRY(dit_cuda_silu_gate(h->op, ob, h->g, N, F, s));
            const struct dit_gemm_product ff_out = {.d = h->x,
                                                    .a = h->op,
                                                    .w = l->ff_out,
                                                    .bias = l->ff_out_b,
                                                    .c = h->x,
                                                    .M = N,
                                                    .K = F,
                                                    .N = D,
                                                    .lda = F,
                                                    .ldd = D};
            TRY(dit_gemm_run(h->gemm, &ff_out, s));
        }
    }

    /* 4. drop the time token, proj_out, residual 1x1 conv, back to channels-first */
    TRY(operand(h, &a, h->x, (size_t)N * D, s));
    for (int b = 0; b < B; b++) {
        const struct dit_gemm_product proj_out = {.d = h->y + (size_t)b * L * C,
                                                  .a = op_at(h, a, ((size_t)b * T + 1) * D),
                                                  .w = h->proj_out,
                                                  .M = L,
                                                  .K = D,
                                                  .N = C,
                                                  .lda = D,
                                                  .ldd = C};
        TRY(dit_gemm_run(h->gemm, &proj_out, s));
    }
    TRY(operand(h, &a, h->y, (size_t)BL * C, s));
    const struct dit_gemm_product post = {
        .d = h->yp, .a = a, .w = h->post_w, .c = h->y, .M = BL, .K = C, .N = C, .lda = C, .ldd = C};
    TRY(dit_gemm_run(h->gemm, &post, s));
    for (int b = 0; b < B; b++)
        TRY(dit_cuda_transpose_out(v + (size_t)b * C * L, h->yp + (size_t)b * L * C, L, C, s));
#undef TRY
    return 0;
}

extern "C" double dit_cuda_forward_flops(const struct dit_config *g, int B, int L)
{
    double T = L + 1.0, D = g->n_heads * (double)g->head_dim, F = g->ff_inner, C = g->in_ch;
    double Cc = 2.0 * C + g->cond_dim;
    double block = T * (4.0 * D * D + 3.0 * F * D) + 2.0 * T * T * D;
    double io = L * (Cc * Cc + Cc * D + D * C + C * C) + g->fourier_dim * D + D * D;
    return 2.0 * B * (g->n_layers * block + io);
}
