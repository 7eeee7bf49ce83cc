/* deploy/k8s/mm3.yaml without a cluster: every document parses (mm3's YAML reader:
 * duplicate keys refused), the kinds are a ConfigMap, a Deployment and a Service, and
 * the fields that make the replicas work agree with each other and with mm3: GPU
 * limits, probes on stage 0's health paths, scrape annotations on the metrics port, the
 * checkpoint volume read-only at the launcher's --model, a memory-backed /dev/shm for
 * the rings, the deploy file from the ConfigMap, a grace period the launcher's stop
 * fits in, and a Service whose selector and target port reach the pods. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/deploy_yaml.h"
#include "common/error.h"
#include "support/test_support.h"

#define MAX_DOCS 8

struct manifests {
    struct mm3_yaml_node *doc[MAX_DOCS];
    int n;
};

/* Parses each `---`-separated document of the file (a part with only comments is
 * none). */
static void manifests_load(struct manifests *m, const char *path)
{
    memset(m, 0, sizeof *m);
    char *text = test_file_read(path, NULL);
    assert_non_null(text);
    char *part = text;
    for (;;) {
        char *sep = strstr(part, "\n---");
        while (sep && sep[4] != '\n' && sep[4] != '\0')
            sep = strstr(sep + 1, "\n---");
        size_t len = sep ? (size_t)(sep - part) + 1 : strlen(part);
        char name[64];
        snprintf(name, sizeof name, "deploy/k8s/mm3.yaml, document %d", m->n + 1);
        struct mm3_yaml_node *root = NULL;
        int rc = mm3_yaml_tree_parse(part, len, name, &root);
        if (rc < 0) fprintf(stderr, "%s\n", mm3_last_error());
        assert_int_equal(rc, 0);
        if (root) {
            assert_true(m->n < MAX_DOCS);
            m->doc[m->n++] = root;
        }
        if (!sep) break;
        part = sep + 4;
    }
    free(text);
}

static void manifests_free(struct manifests *m)
{
    for (int i = 0; i < m->n; i++)
        mm3_yaml_tree_free(m->doc[i]);
}

/* The value at a dotted path of map keys (a key may hold dots when given in [brackets],
 * e.g. "limits.[nvidia.com/gpu]"); fails the test naming the path when absent. */
static const struct mm3_yaml_node *at(const struct mm3_yaml_node *n, const char *path)
{
    char key[128];
    const char *p = path;
    while (*p) {
        size_t k;
        if (*p == '[') {
            const char *e = strchr(p, ']');
            assert_non_null(e);
            k = (size_t)(e - p - 1);
            assert_true(k < sizeof key);
            memcpy(key, p + 1, k);
            p = e + 1;
        } else {
            k = strcspn(p, ".");
            assert_true(k < sizeof key);
            memcpy(key, p, k);
            p += k;
        }
        key[k] = '\0';
        if (*p == '.') p++;
        const struct mm3_yaml_node *next = NULL;
        if (n && n->kind == MM3_YAML_MAP)
            for (size_t i = 0; i < n->n; i++)
                if (strcmp(n->keys[i]->text, key) == 0) next = n->items[i];
        if (!next) fprintf(stderr, "deploy/k8s/mm3.yaml: no `%s` (in %s)\n", key, path);
        assert_non_null(next);
        n = next;
    }
    return n;
}

static const char *text_at(const struct mm3_yaml_node *n, const char *path)
{
    const struct mm3_yaml_node *v = at(n, path);
    if (v->kind != MM3_YAML_SCALAR) fprintf(stderr, "deploy/k8s/mm3.yaml: %s is not a scalar\n", path);
    assert_int_equal(v->kind, MM3_YAML_SCALAR);
    return v->text;
}

static long long int_at(const struct mm3_yaml_node *n, const char *path)
{
    long long v;
    if (mm3_yaml_int(at(n, path), &v) < 0) fprintf(stderr, "deploy/k8s/mm3.yaml: %s is not an integer\n", path);
    assert_int_equal(mm3_yaml_int(at(n, path), &v), 0);
    return v;
}

/* The item of a list of maps whose `key` is `value`, or NULL. */
static const struct mm3_yaml_node *item_with(const struct mm3_yaml_node *seq, const char *key, const char *value)
{
    assert_int_equal(seq->kind, MM3_YAML_SEQ);
    for (size_t i = 0; i < seq->n; i++) {
        const struct mm3_yaml_node *it = seq->items[i];
        if (it->kind != MM3_YAML_MAP) continue;
        for (size_t j = 0; j < it->n; j++)
            if (strcmp(it->keys[j]->text, key) == 0 && it->items[j]->kind == MM3_YAML_SCALAR &&
                strcmp(it->items[j]->text, value) == 0)
                return it;
    }
    return NULL;
}

/* The one document of `kind` (and its apiVersion). */
static const struct mm3_yaml_node *doc_of_kind(const struct manifests *m, const char *kind, const char *api)
{
    const struct mm3_yaml_node *found = NULL;
    for (int i = 0; i < m->n; i++) {
        if (strcmp(text_at(m->doc[i], "kind"), kind) != 0) continue;
        assert_null(found);
        found = m->doc[i];
    }
    if (!found) fprintf(stderr, "deploy/k8s/mm3.yaml: no %s\n", kind);
    assert_non_null(found);
    assert_string_equal(text_at(found, "apiVersion"), api);
    assert_true(strlen(text_at(found, "metadata.name")) > 0);
    return found;
}

/* Every key of labels `sub` is in `super` with the same value. */
static void assert_labels_within(const struct mm3_yaml_node *sub, const struct mm3_yaml_node *super)
{
    assert_int_equal(sub->kind, MM3_YAML_MAP);
    assert_true(sub->n > 0);
    for (size_t i = 0; i < sub->n; i++) {
        char path[160];
        snprintf(path, sizeof path, "[%s]", sub->keys[i]->text);
        assert_string_equal(text_at(super, path), sub->items[i]->text);
    }
}

static void test_manifests(void **state)
{
    (void)state;
    char path[1200];
    snprintf(path, sizeof path, "%s/deploy/k8s/mm3.yaml", test_source_dir());
    struct manifests m;
    manifests_load(&m, path);
    for (int i = 0; i < m.n; i++) {
        const char *k = text_at(m.doc[i], "kind");
        assert_true(strcmp(k, "ConfigMap") == 0 || strcmp(k, "Deployment") == 0 || strcmp(k, "Service") == 0);
    }
    const struct mm3_yaml_node *cm = doc_of_kind(&m, "ConfigMap", "v1");
    const struct mm3_yaml_node *dep = doc_of_kind(&m, "Deployment", "apps/v1");
    const struct mm3_yaml_node *svc = doc_of_kind(&m, "Service", "v1");

    assert_true(int_at(dep, "spec.replicas") >= 1);
    const struct mm3_yaml_node *tpl = at(dep, "spec.template");
    const struct mm3_yaml_node *labels = at(tpl, "metadata.labels");
    assert_labels_within(at(dep, "spec.selector.matchLabels"), labels);
    assert_labels_within(at(svc, "spec.selector"), labels);
    /* the labels the llm-d endpoint picker's InferencePool selects (docs/operations.md) */
    assert_string_equal(text_at(labels, "[llm-d.ai/inferenceServing]"), "true");
    assert_true(strlen(text_at(labels, "[llm-d.ai/model]")) > 0);

    const struct mm3_yaml_node *pod = at(tpl, "spec");
    /* The launcher stops its stages within 30 s of SIGTERM (drain included): the
     * kubelet must not SIGKILL it first. */
    assert_true(int_at(pod, "terminationGracePeriodSeconds") >= 30);
    const struct mm3_yaml_node *containers = at(pod, "containers");
    assert_int_equal(containers->kind, MM3_YAML_SEQ);
    assert_int_equal(containers->n, 1);
    const struct mm3_yaml_node *c = containers->items[0];
    assert_true(strlen(text_at(c, "image")) > 0);
    const struct mm3_yaml_node *http = item_with(at(c, "ports"), "name", "http");
    assert_non_null(http);
    const char *port = text_at(http, "containerPort");

    const struct mm3_yaml_node *ann = at(tpl, "metadata.annotations");
    assert_string_equal(text_at(ann, "[prometheus.io/scrape]"), "true");
    assert_string_equal(text_at(ann, "[prometheus.io/path]"), "/metrics");
    assert_string_equal(text_at(ann, "[prometheus.io/port]"), port);

    assert_true(int_at(c, "resources.limits.[nvidia.com/gpu]") >= 1);
    const char *probes[][2] = {
        {"livenessProbe", "/health/live"}, {"readinessProbe", "/health/ready"}, {"startupProbe", "/health/live"}};
    for (size_t i = 0; i < 3; i++) {
        const struct mm3_yaml_node *g = at(at(c, probes[i][0]), "httpGet");
        assert_string_equal(text_at(g, "path"), probes[i][1]);
        const char *p = text_at(g, "port");
        assert_true(strcmp(p, "http") == 0 || strcmp(p, port) == 0);
    }

    /* Every mount names a volume of the pod. */
    const struct mm3_yaml_node *mounts = at(c, "volumeMounts"), *volumes = at(pod, "volumes");
    assert_int_equal(mounts->kind, MM3_YAML_SEQ);
    for (size_t i = 0; i < mounts->n; i++)
        assert_non_null(item_with(volumes, "name", text_at(mounts->items[i], "name")));
    /* The rings live in /dev/shm: memory-backed, not the container's 64 MiB default. */
    const struct mm3_yaml_node *shm_mount = item_with(mounts, "mountPath", "/dev/shm");
    assert_non_null(shm_mount);
    const struct mm3_yaml_node *shm = item_with(volumes, "name", text_at(shm_mount, "name"));
    assert_string_equal(text_at(shm, "emptyDir.medium"), "Memory");

    /* The command is the launcher on the mounted deploy file, with --model the
     * checkpoint volume, mounted read-only. */
    const struct mm3_yaml_node *cmd = at(c, "command");
    assert_int_equal(cmd->kind, MM3_YAML_SEQ);
    assert_true(cmd->n >= 2);
    assert_string_equal(cmd->items[0]->text, "scripts/launch.sh");
    const char *deploy_path = cmd->items[1]->text, *model = NULL;
    for (size_t i = 2; i + 1 < cmd->n; i++)
        if (strcmp(cmd->items[i]->text, "--model") == 0) model = cmd->items[i + 1]->text;
    assert_non_null(model);
    const struct mm3_yaml_node *ckpt_mount = item_with(mounts, "mountPath", model);
    assert_non_null(ckpt_mount);
    assert_string_equal(text_at(ckpt_mount, "readOnly"), "true");
    const struct mm3_yaml_node *ckpt = item_with(volumes, "name", text_at(ckpt_mount, "name"));
    assert_true(strlen(text_at(ckpt, "persistentVolumeClaim.claimName")) > 0);
    /* deploy_path = <mount of the ConfigMap volume>/<a key of the ConfigMap> */
    const char *slash = strrchr(deploy_path, '/');
    assert_non_null(slash);
    char dir[256];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - deploy_path), deploy_path);
    const struct mm3_yaml_node *cfg_mount = item_with(mounts, "mountPath", dir);
    assert_non_null(cfg_mount);
    const struct mm3_yaml_node *cfg = item_with(volumes, "name", text_at(cfg_mount, "name"));
    assert_string_equal(text_at(cfg, "configMap.name"), text_at(cm, "metadata.name"));
    char key[160];
    snprintf(key, sizeof key, "[%s]", slash + 1);
    at(at(cm, "data"), key);

    /* The Service reaches the pods' HTTP port. */
    const struct mm3_yaml_node *sp = at(svc, "spec.ports");
    assert_int_equal(sp->kind, MM3_YAML_SEQ);
    assert_true(sp->n >= 1);
    const char *target = text_at(sp->items[0], "targetPort");
    assert_true(strcmp(target, "http") == 0 || strcmp(target, port) == 0);
    manifests_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
