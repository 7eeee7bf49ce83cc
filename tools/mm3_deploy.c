/* mm3-deploy: check a deploy file and print what scripts/launch.sh needs from it.
 *
 *   mm3-deploy --check DEPLOY.yaml
 *       load and validate the file (common/deploy.h); exit 0 and print nothing but its
 *       warnings, or exit 1 with the error ("<file>:<line>:<col>: <key path>: ...").
 *   mm3-deploy --launch-env DEPLOY.yaml
 *       the same, then one "key value" line per setting the launcher applies before the
 *       stages start (values are single words):
 *           backend auto|cpu|cuda
 *           mps off|auto|on
 *           stage0_device N                   (devices[0] of each stage)
 *           stage1_device N
 *           stage0_mps_thread_percentage P    (0: no limit)
 *           stage1_mps_thread_percentage P
 *           stage1_workers N                  (stage-1 processes: its devices, or replicas)
 * Exit status 2 for a bad command line. */
#include <stdio.h>
#include <string.h>

#include "common/deploy.h"
#include "common/error.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: mm3-deploy --check DEPLOY.yaml\n"
               "       mm3-deploy --launch-env DEPLOY.yaml\n");
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 3 || (strcmp(argv[1], "--check") && strcmp(argv[1], "--launch-env"))) {
        usage(stderr);
        return 2;
    }
    struct mm3_deploy d;
    if (mm3_deploy_load(&d, argv[2]) < 0) {
        fprintf(stderr, "mm3-deploy: %s\n", mm3_last_error());
        return 1;
    }
    if (!strcmp(argv[1], "--launch-env")) {
        printf("backend %s\n", mm3_backend_name(d.backend));
        printf("mps %s\n", mm3_mps_mode_name(d.mps));
        for (int i = 0; i < MM3_DEPLOY_NUM_STAGES; i++) {
            const struct mm3_stage_config *s = mm3_deploy_stage(&d, i);
            printf("stage%d_device %d\n", i, s->n_devices > 0 ? s->devices[0] : 0);
            printf("stage%d_mps_thread_percentage %d\n", i, s->mps_thread_percentage);
        }
        printf("stage1_workers %d\n", mm3_deploy_stage1_workers(&d));
        printf("stage1_matmul_precision %s\n", mm3_matmul_precision_name(mm3_deploy_stage(&d, 1)->matmul_precision));
    }
    mm3_deploy_free(&d);
    return 0;
}
