/* The live runner: `tandem up` as a child process, host samples, and one
 * load generator run per cell. See exp_live.h. */
#define _GNU_SOURCE
#include "exp_live.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "exp_scrape.h"
#include "exp_util.h"
#include "supervise.h"
#include "tandem_err.h"
#include "up.h"

/* ------------------------------------------------------------------ */
/* The cluster: `tandem up` as a child process                          */
/* ------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    if (s <= 0) {
        return;
    }
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !exp_stop_requested()) {
    }
}

/* Copies the last lines of a log (at most max bytes) to stderr. */
static void print_tail(const char *path, long max)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > max ? size - max : 0;
    fseek(f, from, SEEK_SET);
    char buf[512];
    size_t n;
    fprintf(stderr, "--- last lines of %s ---\n", path);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
        fwrite(buf, 1, n, stderr);
    }
    fclose(f);
}

/* Waits up to timeout_s for pid to exit; returns 1 when it did. */
static int wait_exit(pid_t pid, double timeout_s, int *status)
{
    double end = now_s() + timeout_s;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) {
            return 1;
        }
        if (now_s() >= end) {
            return 0;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Stops the cluster: SIGTERM (tandem up stops everything within its 5 s),
 * SIGKILL after 10 s (the workers then get their death signal). */
static void up_stop(struct exp_live *u)
{
    if (u->pid <= 0) {
        return;
    }
    int status = 0;
    kill(u->pid, SIGTERM);
    if (!wait_exit(u->pid, 10, &status)) {
        fprintf(stderr, "[exp] tandem up (pid %d) did not stop within 10 s: SIGKILL\n",
                (int)u->pid);
        kill(u->pid, SIGKILL);
        wait_exit(u->pid, 5, &status);
    } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        fprintf(stderr, "[exp] tandem up (pid %d) ended with status 0x%x (see %s)\n", (int)u->pid,
                status, u->log_path);
    }
    u->pid = 0;
}

/* Starts `bin up -c cluster_file --port 0 --run-dir run_dir` with stdout
 * and stderr in log_path, and waits for its READY line. 0, TANDEM_EIO
 * (could not start, or it exited: message in err), TANDEM_ETIMEOUT,
 * TANDEM_ECANCELLED (a stop signal). */
static int up_start(const char *bin, const char *cluster_file, const char *run_dir,
                    double timeout_s, struct exp_live *u, char *err, size_t errlen)
{
    char tbuf[32];
    snprintf(tbuf, sizeof(tbuf), "%g", timeout_s);
    char *argv[] = {
        (char *)bin, (char *)"up",        (char *)"-c",    (char *)cluster_file, (char *)"--port",
        (char *)"0", (char *)"--run-dir", (char *)run_dir, (char *)"--timeout",  tbuf,
        NULL};
    int fd = open(u->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        exp_sfmt(err, errlen, "cannot create %s: %s", u->log_path, strerror(errno));
        return TANDEM_EIO;
    }
    double t0 = now_s();
    /* Its own process group, so a terminal's Ctrl-C reaches the runner only,
     * which stops things in order; the death signal stops the cluster if the
     * runner dies. */
    pid_t pid;
    if (sv_spawn(argv, fd, &pid) != 0) {
        int e = errno;
        close(fd);
        exp_sfmt(err, errlen, "fork: %s", strerror(e));
        return TANDEM_EIO;
    }
    close(fd);
    u->pid = pid;
    FILE *f = fopen(u->log_path, "r");
    char line[4096];
    double deadline = t0 + timeout_s + 15;
    int rc = TANDEM_ETIMEOUT;
    while (f) {
        long pos = ftell(f);
        if (fgets(line, sizeof(line), f) && strchr(line, '\n')) {
            if (strncmp(line, "READY id=up ", 12) == 0) {
                char http[160];
                if (up_ready_field(line, "http", http, sizeof(http)) == 0) {
                    char *colon = strrchr(http, ':');
                    if (colon) {
                        *colon = '\0';
                        exp_sfmt(u->host, sizeof(u->host), "%s", http);
                        u->port = atoi(colon + 1);
                        rc = 0;
                        break;
                    }
                }
            }
            continue;
        }
        fseek(f, pos, SEEK_SET); /* a partial line: read it again when complete */
        clearerr(f);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            u->pid = 0;
            exp_sfmt(err, errlen, "tandem up exited before the cluster was up (status 0x%x)",
                     status);
            rc = TANDEM_EIO;
            break;
        }
        if (exp_stop_requested()) {
            rc = TANDEM_ECANCELLED;
            exp_sfmt(err, errlen, "interrupted");
            break;
        }
        if (now_s() > deadline) {
            exp_sfmt(err, errlen, "tandem up printed no READY line within %.0f s", timeout_s + 15);
            break;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (f) {
        fclose(f);
    } else {
        exp_sfmt(err, errlen, "cannot read %s", u->log_path);
        rc = TANDEM_EIO;
    }
    u->up_s = now_s() - t0;
    if (rc != 0) {
        if (rc != TANDEM_ECANCELLED) {
            print_tail(u->log_path, 2000);
        }
        up_stop(u);
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* Host measurements                                                   */
/* ------------------------------------------------------------------ */

struct host_sample {
    double t;
    unsigned long long busy, total; /* /proc/stat jiffies */
    double cluster_cpu;             /* seconds */
    double self_cpu;                /* seconds */
    double load1;
};

/* CPU seconds of pid and its direct children, with their reaped children. */
static double tree_cpu(pid_t root)
{
    if (root <= 0) {
        return 0;
    }
    DIR *d = opendir("/proc");
    if (!d) {
        return NAN;
    }
    double hz = (double)sysconf(_SC_CLK_TCK);
    double sum = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)de->d_name[0])) {
            continue;
        }
        char path[64], buf[1024];
        exp_sfmt(path, sizeof(path), "/proc/%.20s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) {
            continue;
        }
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *p = strrchr(buf, ')');
        if (!p) {
            continue;
        }
        /* After the comm: state ppid pgrp session tty tpgid flags minflt
         * cminflt majflt cmajflt utime stime cutime cstime. */
        char state;
        int ppid;
        unsigned long long skip, ut, st, cut, cst;
        if (sscanf(p + 2, "%c %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu",
                   &state, &ppid, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip,
                   &ut, &st, &cut, &cst) != 15) {
            continue;
        }
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid == root || ppid == root) {
            sum += (double)(ut + st + cut + cst) / hz;
        }
    }
    closedir(d);
    return sum;
}

static void host_sample(struct host_sample *s, pid_t cluster)
{
    memset(s, 0, sizeof(*s));
    s->t = now_s();
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        unsigned long long v[8] = {0};
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) == 8) {
            for (int i = 0; i < 8; i++) {
                s->total += v[i];
            }
            s->busy = s->total - v[3] - v[4]; /* minus idle and iowait */
        }
        fclose(f);
    }
    s->load1 = NAN;
    f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &s->load1) != 1) {
            s->load1 = NAN;
        }
        fclose(f);
    }
    s->cluster_cpu = tree_cpu(cluster);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    s->self_cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                  (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void host_diff(const struct host_sample *a, const struct host_sample *b, struct exp_host *h)
{
    h->wall_s = b->t - a->t;
    h->host_busy =
        b->total > a->total ? (double)(b->busy - a->busy) / (double)(b->total - a->total) : NAN;
    h->cluster_cpu_s = b->cluster_cpu - a->cluster_cpu;
    h->loadgen_cpu_s = b->self_cpu - a->self_cpu;
    h->load1_start = a->load1;
    h->load1_end = b->load1;
    h->ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/* ------------------------------------------------------------------ */
/* The runner's operations                                             */
/* ------------------------------------------------------------------ */

static int live_start(void *r, const struct exp_start *s, char *err, size_t errlen, char *note,
                      size_t notelen)
{
    struct exp_live *l = r;
    const char *label = s->e->configs[s->config].label;
    char rd[PATH_MAX + 64];
    l->pid = 0;
    l->host[0] = '\0';
    l->port = 0;
    l->up_s = 0;
    exp_sfmt(rd, sizeof(rd), "%s/runs/%s", l->out_dir, s->name);
    exp_sfmt(l->log_path, sizeof(l->log_path), "%s/logs/%s.up.log", l->out_dir, s->name);
    int rc = up_start(l->bin, s->cluster_file, rd, s->e->up_timeout_s, l, err, errlen);
    if (rc == 0) {
        fprintf(stderr, "[exp] %s: up at %s:%d in %.1f s\n", label, l->host, l->port, l->up_s);
    } else {
        exp_sfmt(note, notelen, "the cluster did not start (see %s)", l->log_path);
    }
    return rc;
}

static void live_settle(void *r, double s)
{
    (void)r;
    sleep_s(s);
}

/* Divides every time of res by ts: wall seconds to modelled ones. */
static void to_modelled(struct lg_run_result *res, double ts)
{
    for (size_t i = 0; i < res->n; i++) {
        struct lg_record *rec = &res->records[i];
        rec->arrival_s /= ts;
        rec->start_s /= ts;
        rec->ttft_s /= ts;
        rec->e2el_s /= ts;
        for (uint32_t j = 0; j < rec->n_itl; j++) {
            rec->itl_s[j] /= ts;
        }
    }
    res->duration_s /= ts;
}

static int live_run(void *r, const struct lg_run_config *cfg, struct exp_cell *c,
                    struct exp_run_out *out, char *err, size_t errlen)
{
    struct exp_live *l = r;
    double ts = c->time_scale;
    struct lg_run_config rc = *cfg;
    rc.host = l->host;
    rc.port = l->port;
    rc.request_rate = isinf(cfg->request_rate) ? INFINITY : cfg->request_rate / ts;
    rc.duration_s = cfg->duration_s * ts;
    rc.request_timeout_s = cfg->request_timeout_s * ts;
    rc.think_time_s = cfg->think_time_s * ts;
    rc.workload.trace_time_scale = cfg->workload.trace_time_scale * ts;
    struct host_sample a, b;
    struct exp_steps sa, sb;
    char serr[256];
    int steps_rc = exp_scrape_steps(l->host, l->port, &sa, serr, sizeof(serr));
    host_sample(&a, l->pid);
    int rv = lg_run(&rc, &out->res, err, errlen);
    exp_catch_signals(); /* lg_run leaves SIGINT at its default */
    host_sample(&b, l->pid);
    if (rv != 0) {
        memset(&out->res, 0, sizeof(out->res));
        return rv;
    }
    if (steps_rc == 0) {
        steps_rc = exp_scrape_steps(l->host, l->port, &sb, serr, sizeof(serr));
    }
    if (steps_rc != 0) {
        fprintf(stderr, "[exp] step overrun not measured: %s\n", serr);
    }
    host_diff(&a, &b, &c->host);
    c->host.step_overrun = steps_rc == 0 ? exp_steps_overrun(&sa, &sb) : NAN;
    to_modelled(&out->res, ts);
    snprintf(out->base_url, sizeof(out->base_url), "http://%s:%d", l->host, l->port);
    double so = c->host.step_overrun;
    out->extra = json_pack("{s:s,s:o,s:o}", "up_log", l->log_path, "wall_request_rate",
                           isinf(rc.request_rate) ? json_string("inf") : json_real(rc.request_rate),
                           "step_overrun", isfinite(so) ? json_real(so) : json_null());
    if (!out->extra) {
        lg_run_result_free(&out->res);
        exp_sfmt(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    return 0;
}

static void live_stop(void *r)
{
    up_stop(r);
}

const struct exp_runner_ops exp_live_ops = {
    .name = "live",
    .start = live_start,
    .settle = live_settle,
    .run = live_run,
    .stop = live_stop,
};
