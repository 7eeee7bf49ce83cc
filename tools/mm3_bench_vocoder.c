/* mm3-bench-vocoder: ms per window of the CUDA vocoder (stage1/cuda/vocoder_cuda.h).
 *
 *   mm3-bench-vocoder CKPT_ROOT [L [REPS [fp32|tf32|bf16|fp16]]]  (default L 689, REPS 10, fp32)
 *   mm3-bench-vocoder --release [L [REPS [fp32|tf32|bf16|fp16]]]  (writes a random release-shaped
 *                                                             vocoder to $TMPDIR first)
 *
 * Prints the geometry, L, matmul precision and median ms per window of both tracks (CUDA
 * events around upload, kernels and download, after 2 warm-up decodes), then the row of
 * docs/performance.md's table: that time as a share of a DiT window in the same precision
 * (5.3 s fp32, 0.78 s tf32, 0.44 s bf16, 0.46 s fp16 as measured there; the goal is <= 5%). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#ifdef MM3_HAVE_CUDA
#include "common/ckpt_gen.h"
#include "stage1/cuda/vocoder_cuda.h"
#include "stage1/vocoder.h"

/* A tiny checkpoint whose vocoder has the release geometry (1024 -> 1536 ... 96, 8,8,4,2). */
static int write_release_vocoder(char *dir, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, size, "%s/mm3-bench-vocoder-XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return mm3_errorf(-errno, "%s: cannot create a temporary directory", dir);
    struct ckpt_gen_geometry g;
    int rc = ckpt_gen_preset("tiny", &g);
    if (rc == 0) rc = ckpt_gen_geometry_set(&g, "dit_in", "128");
    if (rc == 0) rc = ckpt_gen_geometry_set(&g, "voc_input_dim", "1024");
    if (rc == 0) rc = ckpt_gen_geometry_set(&g, "voc_hidden", "1536");
    if (rc == 0) rc = ckpt_gen_geometry_set(&g, "ratios", "8,8,4,2");
    struct ckpt_gen_opts o = {.seed = 1};
    if (rc == 0) rc = ckpt_gen_write(dir, &g, &o);
    return rc;
}

static int parse_precision(const char *s, enum mm3_matmul_precision *p)
{
    for (int i = 0; i < MM3_MATMUL_COUNT; i++)
        if (!strcmp(s, mm3_matmul_precision_name((enum mm3_matmul_precision)i))) {
            *p = (enum mm3_matmul_precision)i;
            return 0;
        }
    return mm3_errorf(-EINVAL, "precision '%s': expected fp32, tf32, bf16 or fp16", s);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CKPT_ROOT|--release [L [REPS [fp32|tf32|bf16|fp16]]]\n", argv[0]);
        return 2;
    }
    int L = argc > 2 ? atoi(argv[2]) : 689, reps = argc > 3 ? atoi(argv[3]) : 10;
    enum mm3_matmul_precision prec = MM3_MATMUL_FP32;
    if (argc > 4 && parse_precision(argv[4], &prec) < 0) {
        fprintf(stderr, "mm3-bench-vocoder: %s\n", mm3_last_error());
        return 2;
    }
    char dir[1024];
    const char *root = argv[1];
    if (!strcmp(root, "--release")) {
        if (write_release_vocoder(dir, sizeof dir) < 0) {
            fprintf(stderr, "mm3-bench-vocoder: %s\n", mm3_last_error());
            return 1;
        }
        root = dir;
    }
    struct vocoder *v = NULL;
    struct vocoder_cuda *h = NULL;
    float ms = 0;
    int rc = vocoder_load(&v, root);
    if (rc == 0) rc = vocoder_cuda_create(&h, v, prec, L);
    if (rc == 0) vocoder_drop_weights(v);
    if (rc == 0) rc = vocoder_cuda_bench(h, L, reps, &ms);
    if (rc < 0) {
        fprintf(stderr, "mm3-bench-vocoder: %s\n", mm3_last_error());
        vocoder_cuda_free(h);
        vocoder_free(v);
        return 1;
    }
    /* the DiT's ms per window in docs/performance.md, for the share the issue asks about */
    double dit_ms = prec == MM3_MATMUL_BF16   ? 440.0
                    : prec == MM3_MATMUL_FP16 ? 460.0
                    : prec == MM3_MATMUL_TF32 ? 780.0
                                              : 5300.0;
    const char *pn = mm3_matmul_precision_name(prec);
    printf("mm3-bench-vocoder: %s, hop %d, L %d, both tracks, %s: %.2f ms per window (median of %d)\n", argv[1],
           vocoder_cuda_hop(h), L, pn, ms, reps);
    /* the row of docs/performance.md's table */
    printf("| %s | %.1f | %.1f%% of the %s DiT window (%.0f ms) |\n", pn, ms, 100.0 * ms / dit_ms, pn, dit_ms);
    vocoder_cuda_free(h);
    vocoder_free(v);
    return 0;
}

#else

int main(void)
{
    fprintf(stderr, "mm3-bench-vocoder: built without CUDA\n");
    return 2;
}

#endif
