/* The offline runner: see exp_offline.h. */
#include "exp_offline.h"

#include <math.h>
#include <string.h>

#include "exp_util.h"
#include "tandem_err.h"

static int offline_start(void *r, const struct exp_start *s, char *err, size_t errlen, char *note,
                         size_t notelen)
{
    struct exp_offline *o = r;
    int rc = cluster_load(&o->c, s->cluster_file, err, errlen);
    if (rc != 0) {
        exp_sfmt(note, notelen, "the cluster file was refused");
    }
    return rc;
}

static int offline_run(void *r, const struct lg_run_config *cfg, struct exp_cell *c,
                       struct exp_run_out *out, char *err, size_t errlen)
{
    struct exp_offline *o = r;
    struct sm_stats st;
    int rc = sm_run(o->c, cfg, &o->opt, &out->res, &st, err, errlen);
    if (rc != 0) {
        memset(&out->res, 0, sizeof(out->res));
        return rc;
    }
    c->host = (struct exp_host){
        .host_busy = NAN,
        .cluster_cpu_s = NAN,
        .loadgen_cpu_s = NAN,
        .wall_s = NAN,
        .load1_start = NAN,
        .load1_end = NAN,
        .step_overrun = NAN,
    };
    /* What the simulation did, not what it cost: wall time would make two
     * runs of the same inputs differ. */
    out->extra = json_pack("{s:s,s:I,s:I,s:I,s:I,s:f,s:i,s:i}", "runner", "offline", "events",
                           (json_int_t)st.events, "steps", (json_int_t)st.steps, "messages",
                           (json_int_t)st.messages, "kv_frames", (json_int_t)st.kv_frames,
                           "modelled_s", st.modelled_s, "workers", st.workers, "gpus", st.gpus);
    if (out->extra == NULL) {
        lg_run_result_free(&out->res);
        exp_sfmt(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    return 0;
}

static void offline_stop(void *r)
{
    struct exp_offline *o = r;
    cluster_free(o->c);
    o->c = NULL;
}

const struct exp_runner_ops exp_offline_ops = {
    .name = "offline",
    .start = offline_start,
    .settle = NULL,
    .run = offline_run,
    .stop = offline_stop,
};
