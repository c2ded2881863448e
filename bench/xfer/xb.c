#include "xb.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "tandem_err.h"

void xb_init(void)
{
    h_init();
    bench_set_bin_dir();
}

int xb_spawn(struct xb_worker *w, const char *binary, const char *const *args, const char *name,
             int dial)
{
    memset(w, 0, sizeof(*w));
    snprintf(w->log, sizeof(w->log), "%s/%s.log", h_tmpdir(), name);
    int fd = open(w->log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (fd < 0) {
        fprintf(stderr, "xb: cannot create %s\n", w->log);
        return -1;
    }
    /* The harness lets children inherit stderr: point ours at the log for
     * the duration of the spawn. */
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    close(fd);
    int rc = h_spawn(&w->p, binary, args, 60000);
    dup2(saved, 2);
    close(saved);
    if (rc != 0) {
        fprintf(stderr, "xb: %s did not start (log: %s)\n", binary, w->log);
        return -1;
    }
    if (dial) {
        rc = ctl_dial(&w->ctl, w->p.control, 0);
        if (rc != 0) {
            fprintf(stderr, "xb: dial %s: %s\n", w->p.control, tandem_strerror(rc));
            h_stop(&w->p, SIGKILL, 2000);
            return -1;
        }
        w->has_ctl = 1;
    }
    return 0;
}

void xb_stop(struct xb_worker *w)
{
    if (w->has_ctl) {
        nng_close(w->ctl);
        w->has_ctl = 0;
    }
    if (w->p.pid != 0) {
        h_stop(&w->p, SIGTERM, 5000);
    }
    if (w->log[0] != '\0' && getenv("XB_KEEP_LOGS") == NULL) {
        unlink(w->log);
    }
}

int xb_request(struct xb_worker *w, uint64_t id, const uint32_t *prompt, int n, int max_tokens,
               const char *prefill_kv, struct ctl_stream *st)
{
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = n;
    job.max_tokens = (uint32_t)max_tokens;
    job.ignore_eos = 1;
    job.prefill_address = prefill_kv;
    int rc = ctl_run(w->ctl, id, &job, 300000, st);
    if (rc != 0 || !st->done || st->finish_reason != TANDEM__FINISH__REASON__LENGTH ||
        st->error_code != 0 || st->n_tokens != max_tokens) {
        fprintf(stderr,
                "xb: request %" PRIu64 " on %s: rc %s, done %d, finish %d, busy %d, %d tokens, "
                "error '%s'\n",
                id, w->p.id, tandem_strerror(rc), st->done, st->finish_reason, st->busy,
                st->n_tokens, st->error);
        return -1;
    }
    return 0;
}

/* Calls fn on every line of path that contains "xfer: request <id>: ". */
static int scan_log(const char *path, uint64_t id, void (*fn)(const char *rest, void *arg),
                    void *arg)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    char needle[64];
    snprintf(needle, sizeof(needle), "xfer: request %" PRIu64 ": ", id);
    size_t nlen = strlen(needle);
    char line[1024];
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *at = strstr(line, needle);
        if (at != NULL) {
            fn(at + nlen, arg);
        }
    }
    fclose(f);
    return 0;
}

struct chunks {
    struct xb_chunk *out;
    int n, cap;
};

static void on_chunk(const char *rest, void *arg)
{
    struct chunks *c = arg;
    struct xb_chunk k;
    if (c->n < c->cap && sscanf(rest, "blocks [%d, %d) ready at %lf, %d framed by %lf", &k.first,
                                &k.end, &k.t_ready, &k.n_framed, &k.t_framed) == 5) {
        c->out[c->n++] = k;
    }
}

int xb_p_chunks(const char *log, uint64_t id, struct xb_chunk *out, int cap)
{
    struct chunks c = {.out = out, .cap = cap};
    scan_log(log, id, on_chunk, &c);
    return c.n;
}

struct installs {
    double t_first, t_last;
    int have_first, have_last, total;
};

static void on_install(const char *rest, void *arg)
{
    struct installs *in = arg;
    unsigned idx;
    double t;
    int k, total;
    if (sscanf(rest, "block %u installed at %lf (%d of %d)", &idx, &t, &k, &total) != 4) {
        return;
    }
    if (k == 1) {
        in->t_first = t;
        in->have_first = 1;
    }
    if (k == total) {
        in->t_last = t;
        in->have_last = 1;
        in->total = total;
    }
}

int xb_d_installed(const char *log, uint64_t id, double *t_first, double *t_last, int *n_blocks)
{
    struct installs in = {0};
    scan_log(log, id, on_install, &in);
    if (!in.have_first || !in.have_last) {
        return -1;
    }
    *t_first = in.t_first;
    *t_last = in.t_last;
    *n_blocks = in.total;
    return 0;
}

uint64_t xb_cpu_ns(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/task", (long)pid);
    DIR *d = opendir(path);
    if (d == NULL) {
        return 0;
    }
    uint64_t sum = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char f[300];
        snprintf(f, sizeof(f), "/proc/%ld/task/%s/schedstat", (long)pid, e->d_name);
        FILE *fp = fopen(f, "r");
        unsigned long long ns;
        if (fp != NULL && fscanf(fp, "%llu", &ns) == 1) {
            sum += ns;
        }
        if (fp != NULL) {
            fclose(fp);
        }
    }
    closedir(d);
    return sum;
}
