/* The live worker (library tandem_worker): the host of a wk_core (wk_core.h)
 * shared by tandem-prefill and tandem-decode. It parses the flags, hosts the
 * core on a libuv loop and carries its messages: the control link to the
 * router, the data links between workers, heartbeats and KV events on their
 * timers, the /metrics HTTP port, announcing to a router, and the KV link
 * model of the sim backend. docs/architecture.md ("## Workers") describes
 * the design; docs/protocol.md ("## Worker flows") the messages.
 *
 * One libuv loop thread owns everything: the core (scheduler, KV pool,
 * backend, role), every NNG socket (through common/uvnng for receiving and
 * worker/wk_out for sending) and the HTTP server. The data link receives in
 * uvnng's queued mode: NNG keeps reading KV frames while a step blocks the
 * loop (tiny computes), and the loop handles every queued frame between two
 * steps. The core steps from a uv_idle handle only while it has work that
 * can progress; an idle worker sleeps in epoll (woken by sockets and its
 * heartbeat timer).
 *
 * Timed steps: with a backend that gives its modelled step time
 * (backend_desc.step_seconds, the sim) and a time scale > 0, the backend is
 * built with time_scale 0 and never sleeps. A step is computed at once and
 * ends on step_alarm at its start + modelled seconds x time_scale; until
 * then the loop keeps running, everything the core sends is held (held[])
 * and released at the end, and the jobs, cancels and KV frames that arrive
 * wait in inbox[] and reach the core at the end, in arrival order, for the
 * next step: what the offline simulator does (simulate/sm_worker.c). A
 * heartbeat that falls due during a step leaves at its end, as there.
 *
 * KV link model: with a backend that models the KV link and a time scale
 * > 0 (backend.h transfer_seconds, time_scale), what a role with link_model
 * sends on a data link is held until the end of the step that produced it,
 * then released with each KV frame due when the modelled link to its
 * destination has carried its bytes, plus the link latency. */
#ifndef TANDEM_WORKER_H
#define TANDEM_WORKER_H

#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "auth.h"
#include "http.h"
#include "uvnng.h"
#include "wire.h"
#include "wk_alarm.h"
#include "wk_core.h"
#include "wk_out.h"

#define WORKER_MAX_PEERS    64           /* cached PUSH sockets to other workers */
#define WORKER_PEER_SENDBUF 256          /* messages NNG buffers per peer socket */
#define WORKER_PEER_MAXQ    (256u << 20) /* bytes our own queue holds per peer */
#define WORKER_CTL_SENDBUF  1024         /* messages NNG buffers on the control socket */
#define WORKER_CTL_MAXQ     (64u << 20)
#define WORKER_DATA_RECVBUF 256         /* messages the data link's receive queue holds */
#define WORKER_DATA_RECVQ   (64u << 20) /* bytes at which it stops taking more */
#define WORKER_SEND_TIMEO_MS                                                                       \
    1000 /* NNG send timeout: nothing here blocks, but a                                           \
            stray blocking send must not hang the loop */
#define WORKER_ANNOUNCE_MS 1000

/* A cached PUSH0 socket dialed to another worker's data address; the core
 * sees its link. */
struct wk_peer {
    struct wk_link link; /* addr, up (pipes > 0), ever_up, last_rx_s */
    struct wk_peer *next;
    struct worker *w;
    char *addr; /* (owned) data address as given */
    nng_socket sock;
    struct uvnng u; /* pipe events only */
    struct wk_out out;
    int pipes;             /* live pipes (connections) */
    int refs;              /* requests using it (link_ref) */
    uint64_t link_free_ns; /* KV link model: uv_hrtime until which the link is busy */
    int closing;           /* handles still to close */
};

/* A message held until the end of the step (the KV link model, timed
 * steps). */
struct wk_held {
    nng_msg *msg;
    struct wk_peer *peer; /* referenced while held; NULL: for the router */
    uint64_t model_bytes; /* KV bytes of the modelled GPU it stands for; 0 for others */
};

/* A message that reached the worker during a timed step, for the core at
 * its end: a control envelope or a data-link frame (both owned). */
struct wk_inbox {
    Tandem__Envelope *env; /* NULL: a frame */
    struct wire_frame f;
};

struct worker {
    uv_loop_t loop;
    struct wk_core core;  /* settings, id, own data address, engine, role, metrics */
    uint64_t incarnation; /* start time, unix ms */

    /* Control link (router dials us). */
    struct uvnng ctl;
    struct wk_out ctl_out;
    char ctl_url[WIRE_MAX_ADDR_BYTES + 1];
    int ctl_pipes;        /* 1 while a router is attached */
    uint32_t ctl_pipe_id; /* its pipe */
    /* Cluster secret (docs/protocol.md "Cluster secret"); secret.set = 0:
     * none, and the fields below are unused. On each control pipe both
     * sides challenge the other: ctl_nonce is ours, the router's arrives as
     * router_nonce on router_nonce_pipe (maybe before that pipe's ADD_POST
     * is handled here: NNG does not order the two). */
    struct auth_key secret;
    uint8_t ctl_nonce[AUTH_NONCE_BYTES];
    uint8_t router_nonce[AUTH_NONCE_MAX];
    size_t router_nonce_len;
    uint32_t router_nonce_pipe;
    int ctl_authed;     /* the router on ctl_pipe_id proved the secret: jobs allowed */
    int ctl_hello_sent; /* Hello, heartbeat and snapshot sent on ctl_pipe_id */
    /* Data link (other workers push to us; our address is core.kv_addr). */
    struct uvnng data;
    struct wk_peer *peers;
    int n_peers;
    /* KV link model (see above): on when link_model. */
    int link_model;
    double scale; /* the backend's time scale */
    double (*transfer_seconds)(const struct backend *be, uint64_t bytes);
    struct wk_held *held; /* (cap_held) */
    size_t n_held, cap_held;
    /* Timed steps (see above): on when timed. */
    int timed;
    double (*step_seconds)(const struct backend *be);
    struct wk_alarm step_alarm;
    int holding;            /* a timed step is running: sends held, messages deferred */
    int step_n;             /* what its wk_core_step returned */
    uint64_t step_start_ns; /* uv_hrtime when it began */
    uint64_t step_due_ns;   /* its modelled end */
    struct wk_inbox *inbox; /* (cap_inbox) */
    size_t n_inbox, cap_inbox;
    uint64_t pending_ns; /* uv_hrtime since when work waits for a step; 0: none */
    /* Announce to a router. */
    struct uvnng announce; /* PUSH0, send only; redials by itself (uvnng_dial) */
    int announce_open;
    uv_timer_t announce_timer;

    struct http_server http;
    int http_port;
    char metrics_addr[64];
    uint64_t last_http_errors;  /* mirrored into core.m.http_errors */
    uint64_t last_ctl_messages; /* ctl_out.sent mirrored into core.m.ctl_messages */

    uv_timer_t hb_timer;
    uint64_t last_hb_ns; /* uv_hrtime of the last heartbeat sent */
    uv_idle_t step_idle;
    int stepping;
    uv_check_t flush_check;
    uv_signal_t sigint, sigterm;
    uv_timer_t stop_timer;

    uint64_t version_error_ms; /* last ERROR{EVERSION} sent to the router */

    int stopping;
    uint64_t stop_started_ms;
    int handles_open;
};

/* The whole process: parses flags (--help, --version, exit code 2 on a bad
 * flag), builds the engine, binds, prints the READY line, runs the loop until
 * SIGINT/SIGTERM and cleans up. colocated is the role used with --colocated
 * (NULL: the binary has no such flag). Returns the process exit code. */
int worker_main(int argc, char **argv, const char *binary, const struct worker_role *role,
                const struct worker_role *colocated);

#endif
