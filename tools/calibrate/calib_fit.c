/* Points, pricing and the fit behind tandem-calibrate (calib_fit.h). */
#include "calib_fit.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "sim.h"
#include "tandem_err.h"

#define CALIB_HEADER "id,model,gpu,tp,batch,input,output,kind,measured_ms,source"
#define CALIB_FIELDS 10

/* ---- reading ---------------------------------------------------------- */

static void chomp(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) {
        s[--n] = '\0';
    }
}

/* Splits line at the first CALIB_FIELDS - 1 commas; the last field keeps
 * the rest. Returns the number of fields. */
static int split(char *line, char **f)
{
    int k = 0;
    f[k++] = line;
    for (char *c = line; *c != '\0' && k < CALIB_FIELDS; c++) {
        if (*c == ',') {
            *c = '\0';
            f[k++] = c + 1;
        }
    }
    return k;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) {
        return TANDEM_EINVAL;
    }
    *out = (int)v;
    return 0;
}

static int parse_kind(const char *s, enum calib_kind *k)
{
    static const char *const names[] = {"prefill", "decode", "e2e"};
    for (int i = 0; i < 3; i++) {
        if (strcmp(s, names[i]) == 0) {
            *k = (enum calib_kind)i;
            return 0;
        }
    }
    return TANDEM_EINVAL;
}

/* The sim must accept the shape: tp within the KV heads, weights within
 * tp x HBM at the default utilisation. (KV capacity is not checked: the
 * published runs had it, and the step cost does not depend on it.) */
static const char *check_shape(const struct calib_point *p)
{
    struct sim_config sc;
    sim_default_config(&sc);
    sc.model = p->model->name;
    sc.gpu = p->gpu->name;
    sc.tp = p->tp;
    sc.time_scale = 0;
    struct backend *be = NULL;
    if (sim_create(&be, &sc) != 0) {
        return "the sim refuses this model, GPU and tp (see the log line above)";
    }
    be->ops->destroy(be);
    return NULL;
}

/* The work of each step of p (calib_fit.h: kinds). */
static int build_steps(struct calib_point *p)
{
    const struct preset_model *m = p->model;
    struct model_info mi = {
        .n_layers = m->n_layers, .n_kv_heads = m->n_kv_heads, .head_dim = m->head_dim};
    double kvbpt = (double)backend_kv_bytes_per_token(&mi, KV_DTYPE_BF16);
    p->n_steps = p->kind == CALIB_E2E ? p->output : 1;
    p->steps = calloc((size_t)p->n_steps, sizeof(*p->steps));
    if (p->steps == NULL) {
        return TANDEM_ENOMEM;
    }
    for (int s = 0; s < p->n_steps; s++) {
        int first = p->kind == CALIB_PREFILL || (p->kind == CALIB_E2E && s == 0);
        int pos = first ? 0 : p->input + (p->kind == CALIB_E2E ? s - 1 : 0);
        for (int b = 0; b < p->batch; b++) {
            sim_work_add(&p->steps[s], kvbpt, pos, first ? p->input : 1);
        }
    }
    return 0;
}

static int parse_point(char **f, struct calib_point *p, const char **why)
{
    *why = NULL;
    memset(p, 0, sizeof(*p));
    snprintf(p->id, sizeof(p->id), "%s", f[0]);
    p->model = preset_model_find(f[1]);
    p->gpu = preset_gpu_find(f[2]);
    double ms = 0;
    char *end = NULL;
    if (p->model == NULL || p->gpu == NULL) {
        *why = "unknown model or GPU preset";
    } else if (parse_int(f[3], 1, 1024, &p->tp) != 0 ||
               parse_int(f[4], 1, 1 << 20, &p->batch) != 0 ||
               parse_int(f[5], 1, 1 << 24, &p->input) != 0 ||
               parse_int(f[6], 1, 1 << 24, &p->output) != 0) {
        *why = "tp, batch, input and output must be positive integers";
    } else if (parse_kind(f[7], &p->kind) != 0) {
        *why = "kind must be prefill, decode or e2e";
    } else if ((ms = strtod(f[8], &end)), end == f[8] || *end != '\0' || !(ms > 0)) {
        *why = "measured_ms must be a number > 0";
    } else if (p->input + (p->kind == CALIB_E2E ? p->output : 1) > p->model->max_context) {
        *why = "input + output exceed the model's context";
    } else {
        *why = check_shape(p);
    }
    p->measured_s = ms / 1e3;
    snprintf(p->source, sizeof(p->source), "%s", f[9]);
    if (*why == NULL && build_steps(p) != 0) {
        *why = "out of memory";
    }
    return *why == NULL ? 0 : TANDEM_EINVAL;
}

int calib_read(const char *path, struct calib_point **out, size_t *n, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "r");
    if (fp == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return TANDEM_EIO;
    }
    struct calib_point *pts = NULL;
    size_t cnt = 0, cap = 0;
    int rc = 0, lineno = 0, header = 0;
    char line[2048];
    while (rc == 0 && fgets(line, sizeof(line), fp) != NULL) {
        lineno++;
        chomp(line);
        if (line[0] == '#' || line[0] == '\0') {
            continue;
        }
        if (!header) {
            header = 1;
            if (strcmp(line, CALIB_HEADER) != 0) {
                snprintf(err, errlen, "%s:%d: expected the header '%s'", path, lineno,
                         CALIB_HEADER);
                rc = TANDEM_EINVAL;
            }
            continue;
        }
        char *f[CALIB_FIELDS];
        if (split(line, f) != CALIB_FIELDS) {
            snprintf(err, errlen, "%s:%d: expected %d fields", path, lineno, CALIB_FIELDS);
            rc = TANDEM_EINVAL;
            break;
        }
        if (cnt == cap) {
            cap = cap ? cap * 2 : 32;
            struct calib_point *np = realloc(pts, cap * sizeof(*pts));
            if (np == NULL) {
                rc = TANDEM_ENOMEM;
                break;
            }
            pts = np;
        }
        const char *why = NULL;
        if (parse_point(f, &pts[cnt], &why) != 0) {
            snprintf(err, errlen, "%s:%d: point %s: %s", path, lineno, f[0], why);
            rc = TANDEM_EINVAL;
            break;
        }
        cnt++;
    }
    fclose(fp);
    if (rc == 0 && cnt == 0) {
        snprintf(err, errlen, "%s: no points", path);
        rc = TANDEM_EINVAL;
    }
    if (rc != 0) {
        calib_free(pts, cnt);
        return rc;
    }
    *out = pts;
    *n = cnt;
    return 0;
}

void calib_free(struct calib_point *pts, size_t n)
{
    for (size_t i = 0; pts != NULL && i < n; i++) {
        free(pts[i].steps);
    }
    free(pts);
}

/* ---- pricing ------------------------------------------------------------ */

double calib_model_seconds(const struct calib_point *p, const struct calib_params *params)
{
    struct sim_config sc;
    sim_default_config(&sc);
    sc.tp = p->tp;
    sc.mfu = params->mfu;
    sc.mbu = params->mbu;
    sc.step_overhead_s = params->overhead_s;
    double t = 0;
    for (int s = 0; s < p->n_steps; s++) {
        struct sim_step st;
        sim_step_cost(p->model, p->gpu, &sc, &p->steps[s], &st);
        t += st.seconds;
    }
    return t;
}

double calib_mape(const struct calib_point *pts, size_t n, const unsigned char *use,
                  const struct calib_params *params)
{
    double sum = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (use == NULL || use[i]) {
            double t = calib_model_seconds(&pts[i], params);
            sum += fabs(t - pts[i].measured_s) / pts[i].measured_s;
            k++;
        }
    }
    return k ? 100.0 * sum / (double)k : 0.0;
}

/* ---- fitting -------------------------------------------------------------- */

struct axis {
    double lo, step;
    int n;
};

/* mfu, mbu, overhead_s. */
static const struct axis axes[3] = {{0.01, 0.01, 100}, {0.01, 0.01, 100}, {0.0, 5e-5, 401}};

static double *coord(struct calib_params *p, int a)
{
    return a == 0 ? &p->mfu : a == 1 ? &p->mbu : &p->overhead_s;
}

/* Best grid value of axis a with the others fixed; moves only when strictly
 * better. Returns 1 when it moved. */
static int sweep(const struct calib_point *pts, size_t n, const unsigned char *use,
                 struct calib_params *p, int a)
{
    double best = calib_mape(pts, n, use, p);
    double keep = *coord(p, a), arg = keep;
    for (int i = 0; i < axes[a].n; i++) {
        *coord(p, a) = axes[a].lo + axes[a].step * i;
        double e = calib_mape(pts, n, use, p);
        if (e < best - 1e-9) {
            best = e;
            arg = *coord(p, a);
        }
    }
    *coord(p, a) = arg;
    return arg != keep;
}

static int is_constrained(const struct calib_point *pts, size_t n, const unsigned char *use,
                          struct calib_params *p, int a)
{
    double e = calib_mape(pts, n, use, p), v = *coord(p, a);
    int moved = 0;
    for (int s = -1; s <= 1; s += 2) {
        double x = v + s * axes[a].step;
        if (x < axes[a].lo - 1e-12) {
            continue;
        }
        *coord(p, a) = x;
        moved |= fabs(calib_mape(pts, n, use, p) - e) > 1e-6;
    }
    *coord(p, a) = v;
    return moved;
}

/* Coordinate descent from *p: mbu and overhead first (decode steps, the
 * majority in serving, are memory-bound), then mfu, until nothing moves. */
static void descend(const struct calib_point *pts, size_t n, const unsigned char *use,
                    struct calib_params *p)
{
    static const int order[3] = {1, 2, 0};
    for (int round = 0; round < 200; round++) {
        int moved = 0;
        for (int k = 0; k < 3; k++) {
            moved |= sweep(pts, n, use, p, order[k]);
        }
        if (!moved) {
            break;
        }
    }
}

void calib_fit(const struct calib_point *pts, size_t n, const unsigned char *use,
               struct calib_params *params, int constrained[3])
{
    /* The roofline's max() makes the error surface kinked, so one descent can
     * stop in a valley where the wrong parameter explains the time: restart
     * from a 3 x 3 grid of (mfu, mbu) too, and keep the first best (the given
     * start wins ties). */
    static const double starts[3] = {0.25, 0.5, 0.75};
    struct calib_params best = *params;
    descend(pts, n, use, &best);
    double best_e = calib_mape(pts, n, use, &best);
    for (int i = 0; i < 9; i++) {
        struct calib_params p = {starts[i / 3], starts[i % 3], params->overhead_s};
        descend(pts, n, use, &p);
        double e = calib_mape(pts, n, use, &p);
        if (e < best_e - 1e-9) {
            best = p;
            best_e = e;
        }
    }
    *params = best;
    for (int a = 0; constrained != NULL && a < 3; a++) {
        constrained[a] = is_constrained(pts, n, use, params, a);
    }
}
