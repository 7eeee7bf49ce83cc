/* mm3-bench-vocoder: ms per window of the CUDA vocoder (stage1/cuda/vocoder_cuda.h).
 *
 *   mm3-bench-vocoder CKPT_ROOT [L [REPS [tf32]]]  (default L 689, REPS 10, fp32)
 *   mm3-bench-vocoder --release [L [REPS [tf32]]]  (writes a random release-shaped
 *                                                    vocoder to $TMPDIR first)
 *
 * Prints one line: geometry, L, median ms per window of both tracks (CUDA events around
 * upload, kernels and download, after 2 warm-up decodes). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#ifdef MM3_HAVE_CUDA
#include "common/ckpt_gen.h"
#include "stage1/cuda/vocoder_cuda.h"

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

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CKPT_ROOT|--release [L [REPS]]\n", argv[0]);
        return 2;
    }
    int L = argc > 2 ? atoi(argv[2]) : 689, reps = argc > 3 ? atoi(argv[3]) : 10;
    int tf32 = argc > 4 && !strcmp(argv[4], "tf32");
    char dir[1024];
    const char *root = argv[1];
    if (!strcmp(root, "--release")) {
        if (write_release_vocoder(dir, sizeof dir) < 0) {
            fprintf(stderr, "mm3-bench-vocoder: %s\n", mm3_last_error());
            return 1;
        }
        root = dir;
    }
    struct vocoder_cuda *h;
    float ms = 0;
    int rc = vocoder_cuda_create(&h, root, L);
    if (rc == 0) vocoder_cuda_set_tf32(h, tf32);
    if (rc < 0 || vocoder_cuda_bench(h, L, reps, &ms) < 0) {
        fprintf(stderr, "mm3-bench-vocoder: %s\n", mm3_last_error());
        return 1;
    }
    printf("mm3-bench-vocoder: %s, hop %d, L %d, both tracks, %s: %.2f ms per window (median of %d)\n", argv[1],
           vocoder_cuda_hop(h), L, tf32 ? "tf32" : "fp32", ms, reps);
    vocoder_cuda_free(h);
    return 0;
}

#else

int main(void)
{
    fprintf(stderr, "mm3-bench-vocoder: built without CUDA\n");
    return 2;
}

#endif
