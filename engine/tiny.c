/* The `tiny` backend: llama2.c's transformer over the paged KV cache. */
#include "tiny.h"

#include <errno.h>
#include <stddef.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "kernels.h"
#include "log.h"
#include "tandem_err.h"
#include "tandem_rng.h"

#define TINY_MODEL "tiny" /* the model tiny_default_config builds */

#define TINY_EPS          1e-5f
#define TINY_ROPE_THETA   10000.0f
#define TINY_MAX_WIDTH    (1 << 16) /* dim, hidden_dim */
#define TINY_MAX_LAYERS   1024
#define TINY_MAX_VOCAB    (1 << 21)
#define TINY_MAX_CONTEXT  (1 << 20)
#define TINY_HEADER_BYTES (7 * 4)
/* llama2.c's version-1+ exports start with this uint32 ("ak42"). */
#define LLAMA2C_MAGIC 0x616b3432u
/* Rows of the classifier computed per pass (bounds its scratch). */
#define TINY_CLS_ROWS 64

struct tiny_layer {
    float *rms_att;     /* (dim) */
    float *rms_ffn;     /* (dim) */
    struct kern_mat wq; /* (n_heads*head_dim, dim) */
    struct kern_mat wk; /* (n_kv_heads*head_dim, dim) */
    struct kern_mat wv; /* (n_kv_heads*head_dim, dim) */
    struct kern_mat wo; /* (dim, n_heads*head_dim) */
    struct kern_mat w1; /* (hidden_dim, dim) */
    struct kern_mat w2; /* (dim, hidden_dim) */
    struct kern_mat w3; /* (hidden_dim, dim) */
};

/* One token computed by a forward pass. */
struct tiny_row {
    const struct be_seq *seq;
    int pos;
    uint32_t token;
    float *logits; /* vocab_size floats to fill, or NULL */
};

struct tiny {
    struct backend base; /* first: struct backend * <-> struct tiny * */
    struct tiny_config cfg;
    int head_dim;
    int kv_dim;                /* n_kv_heads * head_dim */
    float *tok_emb;            /* (vocab_size, dim) */
    float *rms_final;          /* (dim) */
    struct tiny_layer *layers; /* (n_layers) */
    struct kern_mat wcls;      /* (vocab_size, dim); a packed copy of tok_emb when shared */

    /* Scratch for one call, grown to cap_rows rows on demand. */
    int cap_rows;
    struct tiny_row *rows; /* (cap_rows) */
    float *x;              /* (cap_rows, dim) residual stream */
    float *xb;             /* (cap_rows, dim) */
    float *q;              /* (cap_rows, dim) */
    float *k;              /* (cap_rows, kv_dim) */
    float *v;              /* (cap_rows, kv_dim) */
    float *att;            /* (cap_rows, dim) attention output */
    float *hb;             /* (cap_rows, hidden_dim) */
    float *hb2;            /* (cap_rows, hidden_dim) */
    float *rope;           /* (cap_rows, head_dim): cos, sin per pair */
    float *scores;         /* (n_heads, max_context) */
    float *lg;             /* (TINY_CLS_ROWS, vocab_size) */
    int cap_blk;
    const void **kblk; /* (cap_blk) keys of the current layer, per block of the current row */
    const void **vblk; /* (cap_blk) values, likewise */
};

static const struct backend_ops tiny_ops;

static struct tiny *tiny_of(struct backend *be)
{
    return (struct tiny *)be;
}

/* ---- construction --------------------------------------------------------- */

static int config_check(const struct tiny_config *c, const char **why)
{
    if (c->dim < 1 || c->dim > TINY_MAX_WIDTH)
        *why = "dim out of range";
    else if (c->hidden_dim < 1 || c->hidden_dim > TINY_MAX_WIDTH)
        *why = "hidden_dim out of range";
    else if (c->n_layers < 1 || c->n_layers > TINY_MAX_LAYERS)
        *why = "n_layers out of range";
    else if (c->n_heads < 1 || c->n_heads > c->dim)
        *why = "n_heads out of range";
    else if (c->n_kv_heads < 1 || c->n_kv_heads > c->n_heads)
        *why = "n_kv_heads out of range";
    else if (c->vocab_size < 1 || c->vocab_size > TINY_MAX_VOCAB)
        *why = "vocab_size out of range";
    else if (c->max_context < 1 || c->max_context > TINY_MAX_CONTEXT)
        *why = "max_context out of range";
    else if (c->dim % c->n_heads != 0)
        *why = "dim is not a multiple of n_heads";
    else if ((c->dim / c->n_heads) % 2 != 0)
        *why = "head_dim is odd (RoPE rotates pairs)";
    else if (c->n_heads % c->n_kv_heads != 0)
        *why = "n_heads is not a multiple of n_kv_heads";
    else
        return 0;
    return TANDEM_EINVAL;
}

static void free_scratch(struct tiny *t)
{
    free(t->rows);
    free(t->x);
    free(t->xb);
    free(t->q);
    free(t->k);
    free(t->v);
    free(t->att);
    free(t->hb);
    free(t->hb2);
    free(t->rope);
    t->rows = NULL;
    t->x = t->xb = t->q = t->k = t->v = t->att = t->hb = t->hb2 = t->rope = NULL;
    t->cap_rows = 0;
}

static void tiny_destroy(struct backend *be)
{
    if (be == NULL)
        return;
    struct tiny *t = tiny_of(be);
    free_scratch(t);
    free(t->scores);
    free(t->lg);
    free(t->kblk);
    free(t->vblk);
    if (t->layers != NULL) {
        for (int l = 0; l < t->cfg.n_layers; l++) {
            struct tiny_layer *L = &t->layers[l];
            free(L->rms_att);
            free(L->rms_ffn);
            kern_mat_free(&L->wq);
            kern_mat_free(&L->wk);
            kern_mat_free(&L->wv);
            kern_mat_free(&L->wo);
            kern_mat_free(&L->w1);
            kern_mat_free(&L->w2);
            kern_mat_free(&L->w3);
        }
    }
    free(t->layers);
    kern_mat_free(&t->wcls);
    free(t->tok_emb);
    free(t->rms_final);
    free(t);
}

/* Allocates a model of shape c with zero weights (wcls unallocated when
 * shared: the caller packs it from tok_emb). */
static int tiny_alloc(struct tiny **out, const struct tiny_config *c)
{
    struct tiny *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return TANDEM_ENOMEM;
    t->base.ops = &tiny_ops;
    t->cfg = *c;
    t->head_dim = c->dim / c->n_heads;
    t->kv_dim = c->n_kv_heads * t->head_dim;
    int dim = c->dim, hid = c->hidden_dim, kvd = t->kv_dim;

    struct model_info *mi = &t->base.info;
    mi->dim = dim;
    mi->hidden_dim = hid;
    mi->n_layers = c->n_layers;
    mi->n_heads = c->n_heads;
    mi->n_kv_heads = c->n_kv_heads;
    mi->head_dim = t->head_dim;
    mi->vocab_size = c->vocab_size;
    mi->max_context = c->max_context;
    mi->bos_id = c->vocab_size > 1 ? 1 : -1;
    mi->eos_id = c->vocab_size > 2 ? 2 : -1;
    mi->emits_tokens = 0;

    t->tok_emb = malloc((size_t)c->vocab_size * (size_t)dim * sizeof(float));
    t->rms_final = malloc((size_t)dim * sizeof(float));
    t->layers = calloc((size_t)c->n_layers, sizeof(*t->layers));
    t->scores = malloc((size_t)c->n_heads * (size_t)c->max_context * sizeof(float));
    t->lg = malloc((size_t)TINY_CLS_ROWS * (size_t)c->vocab_size * sizeof(float));
    if (t->tok_emb == NULL || t->rms_final == NULL || t->layers == NULL || t->scores == NULL ||
        t->lg == NULL)
        goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        struct tiny_layer *L = &t->layers[l];
        L->rms_att = malloc((size_t)dim * sizeof(float));
        L->rms_ffn = malloc((size_t)dim * sizeof(float));
        if (L->rms_att == NULL || L->rms_ffn == NULL)
            goto fail;
        if (kern_mat_alloc(&L->wq, dim, dim) != 0 || kern_mat_alloc(&L->wk, kvd, dim) != 0 ||
            kern_mat_alloc(&L->wv, kvd, dim) != 0 || kern_mat_alloc(&L->wo, dim, dim) != 0 ||
            kern_mat_alloc(&L->w1, hid, dim) != 0 || kern_mat_alloc(&L->w2, dim, hid) != 0 ||
            kern_mat_alloc(&L->w3, hid, dim) != 0)
            goto fail;
    }
    if (c->separate_classifier && kern_mat_alloc(&t->wcls, c->vocab_size, dim) != 0)
        goto fail;
    *out = t;
    return 0;
fail:
    tiny_destroy(&t->base);
    return TANDEM_ENOMEM;
}

void tiny_default_config(struct tiny_config *c)
{
    memset(c, 0, sizeof(*c));
    c->dim = 512;
    c->hidden_dim = 1376;
    c->n_layers = 8;
    c->n_heads = 8;
    c->n_kv_heads = 2;
    c->vocab_size = 512;
    c->max_context = 4096;
    c->seed = 0x7a6e646dULL;
    c->separate_classifier = 0;
}

/* Uniform in [-1, 1), exactly representable (24 random bits). */
static float uniform(uint64_t *s)
{
    int32_t r = (int32_t)(rng_splitmix64(s) >> 40) - (1 << 23);
    return (float)r * (1.0f / (float)(1 << 23));
}

static void fill(float *w, size_t n, float scale, float bias, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        w[i] = bias + scale * uniform(s);
}

/* Fills one layer matrix of every layer, rows in checkpoint order. */
static void fill_mats(struct tiny *t, size_t field, float *row, uint64_t *s)
{
    for (int l = 0; l < t->cfg.n_layers; l++) {
        struct kern_mat *m = (struct kern_mat *)((char *)&t->layers[l] + field);
        float scale = 1.0f / sqrtf((float)m->n_in);
        for (int o = 0; o < m->n_out; o++) {
            fill(row, (size_t)m->n_in, scale, 0.0f, s);
            kern_mat_set_row(m, o, row);
        }
    }
}

static int same_config(const struct tiny_config *a, const struct tiny_config *b)
{
    return a->dim == b->dim && a->hidden_dim == b->hidden_dim && a->n_layers == b->n_layers &&
           a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->vocab_size == b->vocab_size && a->max_context == b->max_context &&
           a->seed == b->seed && (a->separate_classifier != 0) == (b->separate_classifier != 0);
}

int tiny_create(struct backend **out, const struct tiny_config *c)
{
    const char *why = NULL;
    if (out == NULL || c == NULL)
        return TANDEM_EINVAL;
    if (config_check(c, &why) != 0) {
        LOG_ERROR("tiny", "bad model shape: %s", why);
        return TANDEM_EINVAL;
    }
    struct tiny *t;
    int rc = tiny_alloc(&t, c);
    if (rc != 0)
        return rc;
    int dim = c->dim;
    size_t wmax = (size_t)(c->hidden_dim > dim ? c->hidden_dim : dim);
    float *row = malloc(wmax * sizeof(float));
    if (row == NULL) {
        tiny_destroy(&t->base);
        return TANDEM_ENOMEM;
    }
    /* One stream, tensors in llama2.c's checkpoint order. */
    uint64_t s = c->seed;
    fill(t->tok_emb, (size_t)c->vocab_size * (size_t)dim, 0.1f, 0.0f, &s);
    for (int l = 0; l < c->n_layers; l++)
        fill(t->layers[l].rms_att, (size_t)dim, 0.125f, 1.0f, &s);
    fill_mats(t, offsetof(struct tiny_layer, wq), row, &s);
    fill_mats(t, offsetof(struct tiny_layer, wk), row, &s);
    fill_mats(t, offsetof(struct tiny_layer, wv), row, &s);
    fill_mats(t, offsetof(struct tiny_layer, wo), row, &s);
    for (int l = 0; l < c->n_layers; l++)
        fill(t->layers[l].rms_ffn, (size_t)dim, 0.125f, 1.0f, &s);
    fill_mats(t, offsetof(struct tiny_layer, w1), row, &s);
    fill_mats(t, offsetof(struct tiny_layer, w2), row, &s);
    fill_mats(t, offsetof(struct tiny_layer, w3), row, &s);
    fill(t->rms_final, (size_t)dim, 0.125f, 1.0f, &s);
    if (c->separate_classifier) {
        float scale = 1.0f / sqrtf((float)dim);
        for (int o = 0; o < c->vocab_size; o++) {
            fill(row, (size_t)dim, scale, 0.0f, &s);
            kern_mat_set_row(&t->wcls, o, row);
        }
    } else {
        rc = kern_mat_pack(&t->wcls, t->tok_emb, c->vocab_size, dim);
    }
    free(row);
    if (rc != 0) {
        tiny_destroy(&t->base);
        return rc;
    }
    struct tiny_config def;
    tiny_default_config(&def);
    if (same_config(c, &def))
        snprintf(t->base.info.name, sizeof(t->base.info.name), TINY_MODEL);
    else
        snprintf(t->base.info.name, sizeof(t->base.info.name),
                 "tiny-%dx%d-h%d-kv%d-f%d-v%d-c%d%s-%" PRIx64, dim, c->n_layers, c->n_heads,
                 c->n_kv_heads, c->hidden_dim, c->vocab_size, c->max_context,
                 c->separate_classifier ? "-sep" : "", c->seed);
    *out = &t->base;
    return 0;
}

int tiny_get_config(const struct backend *be, struct tiny_config *out)
{
    if (be == NULL || be->ops != &tiny_ops)
        return TANDEM_EINVAL;
    *out = ((const struct tiny *)be)->cfg;
    return 0;
}

double tiny_flops_per_token(const struct model_info *mi, int pos)
{
    double dim = mi->dim, kvd = (double)mi->n_kv_heads * mi->head_dim;
    double per_layer = 2.0 * (2.0 * dim * dim + 2.0 * dim * kvd + 3.0 * dim * mi->hidden_dim);
    double attn = 4.0 * (pos + 1.0) * dim;
    return mi->n_layers * (per_layer + attn) + 2.0 * dim * mi->vocab_size;
}

/* ---- checkpoints ---------------------------------------------------------- */

/* Reads n floats; a short read after the size check means the file changed. */
static int read_floats(FILE *f, float *dst, size_t n, const char *path, const char *what)
{
    if (fread(dst, sizeof(float), n, f) != n) {
        LOG_ERROR("tiny", "%s: short read in %s", path, what);
        return ferror(f) ? TANDEM_EIO : TANDEM_ETRUNCATED;
    }
    return 0;
}

static int read_mats(struct tiny *t, FILE *f, size_t field, float *buf, const char *path,
                     const char *what)
{
    for (int l = 0; l < t->cfg.n_layers; l++) {
        struct kern_mat *m = (struct kern_mat *)((char *)&t->layers[l] + field);
        int rc = read_floats(f, buf, (size_t)m->n_out * (size_t)m->n_in, path, what);
        if (rc != 0)
            return rc;
        for (int o = 0; o < m->n_out; o++)
            kern_mat_set_row(m, o, buf + (size_t)o * (size_t)m->n_in);
    }
    return 0;
}

static void name_from_path(char *dst, size_t cap, const char *path)
{
    const char *base = strrchr(path, '/');
    base = base != NULL ? base + 1 : path;
    size_t len = strlen(base);
    const char *dot = strrchr(base, '.');
    if (dot != NULL && dot != base)
        len = (size_t)(dot - base);
    if (len == 0) {
        base = "checkpoint";
        len = strlen(base);
    }
    if (len >= cap)
        len = cap - 1;
    memcpy(dst, base, len);
    dst[len] = '\0';
}

int tiny_load(struct backend **out, const char *path)
{
    if (out == NULL || path == NULL)
        return TANDEM_EINVAL;
    int rc = 0;
    struct tiny *t = NULL;
    float *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        LOG_ERROR("tiny", "%s: cannot open checkpoint: %s", path, strerror(e));
        return e == ENOENT ? TANDEM_ENOENT : TANDEM_EIO;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        LOG_ERROR("tiny", "%s: not a regular file", path);
        rc = TANDEM_EIO;
        goto out_close;
    }
    uint64_t size = (uint64_t)st.st_size;
    int32_t h[7];
    if (size < TINY_HEADER_BYTES || fread(h, sizeof(int32_t), 7, f) != 7) {
        LOG_ERROR("tiny", "%s: %" PRIu64 " bytes, shorter than the 28-byte llama2.c header", path,
                  size);
        rc = TANDEM_ETRUNCATED;
        goto out_close;
    }
    if ((uint32_t)h[0] == LLAMA2C_MAGIC) {
        LOG_ERROR("tiny", "%s: a llama2.c version-%d export; only the legacy format is supported",
                  path, (int)h[1]);
        rc = TANDEM_EFORMAT;
        goto out_close;
    }
    struct tiny_config c;
    memset(&c, 0, sizeof(c));
    c.dim = h[0];
    c.hidden_dim = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    c.vocab_size = h[5] < 0 ? (h[5] == INT32_MIN ? 0 : -h[5]) : h[5];
    c.separate_classifier = h[5] < 0;
    c.max_context = h[6];
    const char *why = NULL;
    if (config_check(&c, &why) != 0) {
        LOG_ERROR("tiny",
                  "%s: bad llama2.c header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                  "n_kv_heads %d, vocab_size %d, seq_len %d): %s",
                  path, h[0], h[1], h[2], h[3], h[4], h[5], h[6], why);
        rc = TANDEM_EFORMAT;
        goto out_close;
    }
    /* Every count is bounded by config_check, so this cannot overflow. */
    uint64_t dim = (uint64_t)c.dim, hid = (uint64_t)c.hidden_dim, L = (uint64_t)c.n_layers;
    uint64_t hd = dim / (uint64_t)c.n_heads, kvd = hd * (uint64_t)c.n_kv_heads;
    uint64_t voc = (uint64_t)c.vocab_size;
    uint64_t rope_floats = (uint64_t)c.max_context * hd; /* real + imag, hd/2 each */
    uint64_t floats = voc * dim + L * (2 * dim + 2 * dim * dim + 2 * dim * kvd + 3 * dim * hid) +
                      dim + rope_floats + (c.separate_classifier ? voc * dim : 0);
    uint64_t want = TINY_HEADER_BYTES + 4 * floats;
    if (size < want) {
        LOG_ERROR("tiny",
                  "%s: truncated: %" PRIu64 " bytes, the header (dim %d, layers %d, vocab %d%s, "
                  "seq_len %d) needs %" PRIu64,
                  path, size, c.dim, c.n_layers, c.vocab_size,
                  c.separate_classifier ? " separate classifier" : "", c.max_context, want);
        rc = TANDEM_ETRUNCATED;
        goto out_close;
    }
    if (size > want) {
        LOG_ERROR("tiny",
                  "%s: %" PRIu64 " bytes, %" PRIu64 " more than the header (dim %d, layers %d, "
                  "vocab %d, seq_len %d) describes: not a llama2.c legacy checkpoint",
                  path, size, size - want, c.dim, c.n_layers, c.vocab_size, c.max_context);
        rc = TANDEM_EFORMAT;
        goto out_close;
    }
    rc = tiny_alloc(&t, &c);
    if (rc != 0)
        goto out_close;
    uint64_t bufn = dim * (hid > dim ? hid : dim);
    if (c.separate_classifier && voc * dim > bufn)
        bufn = voc * dim;
    buf = malloc((size_t)bufn * sizeof(float));
    if (buf == NULL) {
        rc = TANDEM_ENOMEM;
        goto out_free;
    }
    if ((rc = read_floats(f, t->tok_emb, (size_t)(voc * dim), path, "token_embedding")) != 0)
        goto out_free;
    for (int l = 0; l < c.n_layers; l++)
        if ((rc = read_floats(f, t->layers[l].rms_att, (size_t)dim, path, "rms_att")) != 0)
            goto out_free;
    if ((rc = read_mats(t, f, offsetof(struct tiny_layer, wq), buf, path, "wq")) != 0 ||
        (rc = read_mats(t, f, offsetof(struct tiny_layer, wk), buf, path, "wk")) != 0 ||
        (rc = read_mats(t, f, offsetof(struct tiny_layer, wv), buf, path, "wv")) != 0 ||
        (rc = read_mats(t, f, offsetof(struct tiny_layer, wo), buf, path, "wo")) != 0)
        goto out_free;
    for (int l = 0; l < c.n_layers; l++)
        if ((rc = read_floats(f, t->layers[l].rms_ffn, (size_t)dim, path, "rms_ffn")) != 0)
            goto out_free;
    if ((rc = read_mats(t, f, offsetof(struct tiny_layer, w1), buf, path, "w1")) != 0 ||
        (rc = read_mats(t, f, offsetof(struct tiny_layer, w2), buf, path, "w2")) != 0 ||
        (rc = read_mats(t, f, offsetof(struct tiny_layer, w3), buf, path, "w3")) != 0)
        goto out_free;
    if ((rc = read_floats(f, t->rms_final, (size_t)dim, path, "rms_final")) != 0)
        goto out_free;
    if (fseeko(f, (off_t)(rope_floats * 4), SEEK_CUR) != 0) {
        LOG_ERROR("tiny", "%s: cannot skip the RoPE tables", path);
        rc = TANDEM_EIO;
        goto out_free;
    }
    if (c.separate_classifier) {
        if ((rc = read_floats(f, buf, (size_t)(voc * dim), path, "wcls")) != 0)
            goto out_free;
        for (int o = 0; o < c.vocab_size; o++)
            kern_mat_set_row(&t->wcls, o, buf + (size_t)o * dim);
    } else if ((rc = kern_mat_pack(&t->wcls, t->tok_emb, c.vocab_size, c.dim)) != 0) {
        goto out_free;
    }
    name_from_path(t->base.info.name, sizeof(t->base.info.name), path);
    free(buf);
    fclose(f);
    *out = &t->base;
    return 0;
out_free:
    free(buf);
    tiny_destroy(&t->base);
out_close:
    fclose(f);
    return rc;
}

static int write_floats(FILE *f, const float *src, size_t n)
{
    return fwrite(src, sizeof(float), n, f) == n ? 0 : TANDEM_EIO;
}

static int write_mats(const struct tiny *t, FILE *f, size_t field, float *row)
{
    for (int l = 0; l < t->cfg.n_layers; l++) {
        const struct kern_mat *m = (const struct kern_mat *)((const char *)&t->layers[l] + field);
        for (int o = 0; o < m->n_out; o++) {
            kern_mat_get_row(m, o, row);
            if (write_floats(f, row, (size_t)m->n_in) != 0)
                return TANDEM_EIO;
        }
    }
    return 0;
}

int tiny_save(const struct backend *be, const char *path)
{
    if (be == NULL || be->ops != &tiny_ops || path == NULL)
        return TANDEM_EINVAL;
    const struct tiny *t = (const struct tiny *)be;
    const struct tiny_config *c = &t->cfg;
    int dim = c->dim, rc = 0;
    size_t wmax = (size_t)(c->hidden_dim > dim ? c->hidden_dim : dim);
    if ((size_t)t->head_dim > wmax)
        wmax = (size_t)t->head_dim;
    float *row = malloc(wmax * sizeof(float));
    if (row == NULL)
        return TANDEM_ENOMEM;
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        LOG_ERROR("tiny", "%s: cannot create: %s", path, strerror(errno));
        free(row);
        return TANDEM_EIO;
    }
    int32_t h[7] = {dim,           c->hidden_dim,
                    c->n_layers,   c->n_heads,
                    c->n_kv_heads, c->separate_classifier ? -c->vocab_size : c->vocab_size,
                    c->max_context};
    if (fwrite(h, sizeof(h), 1, f) != 1)
        rc = TANDEM_EIO;
    if (rc == 0)
        rc = write_floats(f, t->tok_emb, (size_t)c->vocab_size * (size_t)dim);
    for (int l = 0; rc == 0 && l < c->n_layers; l++)
        rc = write_floats(f, t->layers[l].rms_att, (size_t)dim);
    if (rc == 0)
        rc = write_mats(t, f, offsetof(struct tiny_layer, wq), row);
    if (rc == 0)
        rc = write_mats(t, f, offsetof(struct tiny_layer, wk), row);
    if (rc == 0)
        rc = write_mats(t, f, offsetof(struct tiny_layer, wv), row);
    if (rc == 0)
        rc = write_mats(t, f, offsetof(struct tiny_layer, wo), row);
    for (int l = 0; rc == 0 && l < c->n_layers; l++)
        rc = write_floats(f, t->layers[l].rms_ffn, (size_t)dim);
    if (rc == 0)
        rc = write_mats(t, f, offsetof(struct tiny_layer, w1), row);
    if (rc == 0)
        rc = write_mats(t, f, offsetof(struct tiny_layer, w2), row);
    if (rc == 0)
        rc = write_mats(t, f, offsetof(struct tiny_layer, w3), row);
    if (rc == 0)
        rc = write_floats(f, t->rms_final, (size_t)dim);
    /* freq_cis_real then freq_cis_imag, (seq_len, head_dim/2) each, as
     * llama2.c's export writes them (the loader skips them). */
    int half = t->head_dim / 2;
    for (int part = 0; rc == 0 && part < 2; part++) {
        for (int p = 0; rc == 0 && p < c->max_context; p++) {
            for (int i = 0; i < half; i++) {
                float freq = 1.0f / powf(TINY_ROPE_THETA, (float)(2 * i) / (float)t->head_dim);
                float val = (float)p * freq;
                row[i] = part == 0 ? cosf(val) : sinf(val);
            }
            rc = write_floats(f, row, (size_t)half);
        }
    }
    if (rc == 0 && c->separate_classifier) {
        for (int o = 0; rc == 0 && o < c->vocab_size; o++) {
            kern_mat_get_row(&t->wcls, o, row);
            rc = write_floats(f, row, (size_t)dim);
        }
    }
    if (fclose(f) != 0 && rc == 0)
        rc = TANDEM_EIO;
    if (rc != 0)
        LOG_ERROR("tiny", "%s: write failed", path);
    free(row);
    return rc;
}

/* ---- forward pass ----------------------------------------------------------- */

static int grow_rows(struct tiny *t, int n)
{
    if (n <= t->cap_rows)
        return 0;
    int cap = t->cap_rows > 0 ? t->cap_rows : 8;
    while (cap < n)
        cap = cap > INT32_MAX / 2 ? n : cap * 2;
    free_scratch(t);
    size_t r = (size_t)cap;
    size_t dim = (size_t)t->cfg.dim, kvd = (size_t)t->kv_dim, hid = (size_t)t->cfg.hidden_dim;
    t->rows = malloc(r * sizeof(*t->rows));
    t->x = malloc(r * dim * sizeof(float));
    t->xb = malloc(r * dim * sizeof(float));
    t->q = malloc(r * dim * sizeof(float));
    t->k = malloc(r * kvd * sizeof(float));
    t->v = malloc(r * kvd * sizeof(float));
    t->att = malloc(r * dim * sizeof(float));
    t->hb = malloc(r * hid * sizeof(float));
    t->hb2 = malloc(r * hid * sizeof(float));
    t->rope = malloc(r * (size_t)t->head_dim * sizeof(float));
    if (t->rows == NULL || t->x == NULL || t->xb == NULL || t->q == NULL || t->k == NULL ||
        t->v == NULL || t->att == NULL || t->hb == NULL || t->hb2 == NULL || t->rope == NULL) {
        free_scratch(t);
        return TANDEM_ENOMEM;
    }
    t->cap_rows = cap;
    return 0;
}

/* Checks that pool matches the model and sizes the per-sequence scratch. */
static int check_pool(struct tiny *t, struct kv_pool *kv, enum kv_dtype *dt, int *bs)
{
    if (kv == NULL)
        return TANDEM_EINVAL;
    const struct kv_config *kc = kv_pool_config(kv);
    if (kc->n_layers != t->cfg.n_layers || kc->n_kv_heads != t->cfg.n_kv_heads ||
        kc->head_dim != t->head_dim) {
        LOG_ERROR("tiny", "KV pool shape (%d layers, %d kv heads, head_dim %d) does not match %s",
                  kc->n_layers, kc->n_kv_heads, kc->head_dim, t->base.info.name);
        return TANDEM_EINVAL;
    }
    if (kc->payload_div < 0 || kc->payload_div > 1 || (unsigned)kc->dtype >= KV_DTYPE_COUNT) {
        LOG_ERROR("tiny", "KV pool has no full payload (payload_div %d)", kc->payload_div);
        return TANDEM_EINVAL;
    }
    *dt = kc->dtype;
    *bs = kc->block_size;
    int nblk = (t->cfg.max_context + kc->block_size - 1) / kc->block_size;
    if (nblk > t->cap_blk) {
        const void **kb = realloc(t->kblk, (size_t)nblk * sizeof(*kb));
        if (kb == NULL)
            return TANDEM_ENOMEM;
        t->kblk = kb;
        const void **vb = realloc(t->vblk, (size_t)nblk * sizeof(*vb));
        if (vb == NULL)
            return TANDEM_ENOMEM;
        t->vblk = vb;
        t->cap_blk = nblk;
    }
    return 0;
}

/* Every position a call touches must be in the model's context and in a
 * block the caller holds. */
static int check_seq(const struct tiny *t, const struct be_seq *seq, int n, int bs)
{
    if (seq == NULL || seq->blocks == NULL || n < 1 || seq->pos < 0)
        return TANDEM_EINVAL;
    if (seq->pos > t->cfg.max_context - n) {
        LOG_ERROR("tiny", "positions %d..%d exceed the context of %s (%d)", seq->pos,
                  seq->pos + n - 1, t->base.info.name, t->cfg.max_context);
        return TANDEM_ERANGE;
    }
    int last = (seq->pos + n - 1) / bs;
    for (int b = 0; b <= last; b++)
        if (seq->blocks[b] < 0)
            return TANDEM_EINVAL;
    return 0;
}

static void rmsnorm(float *o, const float *x, const float *w, int n)
{
    float ss = kern_dot(x, x, n);
    ss = ss / (float)n;
    ss = ss + TINY_EPS;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* cos/sin of every pair of a head at position pos (llama2.c run.c). */
static void rope_table(float *cs, int pos, int hd)
{
    for (int i = 0; i < hd; i += 2) {
        float freq = 1.0f / powf(TINY_ROPE_THETA, (float)i / (float)hd);
        float val = (float)pos * freq;
        cs[i] = cosf(val);
        cs[i + 1] = sinf(val);
    }
}

static void rope_apply(float *vec, int n, const float *cs, int hd)
{
    for (int i = 0; i < n; i += 2) {
        float fcr = cs[i % hd], fci = cs[i % hd + 1];
        float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * fcr - v1 * fci;
        vec[i + 1] = v0 * fci + v1 * fcr;
    }
}

/* The forward pass of n rows. Per layer, every row's K/V is written before any
 * row attends, so a row of a prefill chunk reads exactly what a decode step at
 * its position would. */
static void forward(struct tiny *t, struct kv_pool *kv, enum kv_dtype dt, int bs, int n)
{
    const struct tiny_config *c = &t->cfg;
    int dim = c->dim, kvd = t->kv_dim, hid = c->hidden_dim, hd = t->head_dim;
    struct tiny_row *rows = t->rows;

    for (int r = 0; r < n; r++) {
        memcpy(t->x + (size_t)r * dim, t->tok_emb + (size_t)rows[r].token * dim,
               (size_t)dim * sizeof(float));
        rope_table(t->rope + (size_t)r * hd, rows[r].pos, hd);
    }
    for (int l = 0; l < c->n_layers; l++) {
        const struct tiny_layer *L = &t->layers[l];
        for (int r = 0; r < n; r++)
            rmsnorm(t->xb + (size_t)r * dim, t->x + (size_t)r * dim, L->rms_att, dim);
        kern_matmul(t->q, dim, t->xb, dim, n, &L->wq);
        kern_matmul(t->k, kvd, t->xb, dim, n, &L->wk);
        kern_matmul(t->v, kvd, t->xb, dim, n, &L->wv);
        for (int r = 0; r < n; r++) {
            const float *cs = t->rope + (size_t)r * hd;
            rope_apply(t->q + (size_t)r * dim, dim, cs, hd);
            rope_apply(t->k + (size_t)r * kvd, kvd, cs, hd);
            int p = rows[r].pos;
            uint8_t *blk = kv_block_data(kv, rows[r].seq->blocks[p / bs]);
            kv_quantize(dt, blk + kv_slot_offset(kv, l, 0, p % bs), t->k + (size_t)r * kvd,
                        (size_t)kvd);
            kv_quantize(dt, blk + kv_slot_offset(kv, l, 1, p % bs), t->v + (size_t)r * kvd,
                        (size_t)kvd);
        }
        /* Attention reads each row's K/V where the pool keeps it, in the
         * pool's dtype: keys of a block are rows of kv_dim values from its
         * layer's slot 0 (the layout in kv_cache.h), values from slot 1. */
        size_t koff = kv_slot_offset(kv, l, 0, 0), voff = kv_slot_offset(kv, l, 1, 0);
        size_t row_bytes = (size_t)kvd * kv_dtype_size(dt);
        for (int r = 0; r < n; r++) {
            const struct be_seq *seq = rows[r].seq;
            int npos = rows[r].pos + 1, nblk = (npos + bs - 1) / bs;
            for (int b = 0; b < nblk; b++) {
                const uint8_t *blk = kv_block_data(kv, seq->blocks[b]);
                t->kblk[b] = blk + koff;
                t->vblk[b] = blk + voff;
            }
            if (r + 1 < n && rows[r + 1].seq != seq) {
                /* The next row's first keys, so its attention does not start cold. */
                const uint8_t *nb = kv_block_data(kv, rows[r + 1].seq->blocks[0]) + koff;
                int nrow = rows[r + 1].pos + 1 < bs ? rows[r + 1].pos + 1 : bs;
                for (size_t o = 0; o < (size_t)nrow * row_bytes; o += 64)
                    __builtin_prefetch(nb + o, 0, 3);
            }
            kern_attention(t->att + (size_t)r * dim, t->q + (size_t)r * dim, c->n_heads,
                           c->n_kv_heads, hd, npos, dt, t->kblk, t->vblk, bs, kvd, t->scores);
        }
        kern_matmul(t->xb, dim, t->att, dim, n, &L->wo);
        for (size_t i = 0; i < (size_t)n * dim; i++)
            t->x[i] = t->x[i] + t->xb[i];

        for (int r = 0; r < n; r++)
            rmsnorm(t->xb + (size_t)r * dim, t->x + (size_t)r * dim, L->rms_ffn, dim);
        kern_matmul(t->hb, hid, t->xb, dim, n, &L->w1);
        kern_matmul(t->hb2, hid, t->xb, dim, n, &L->w3);
        kern_swiglu(t->hb, t->hb2, (size_t)n * hid);
        kern_matmul(t->xb, dim, t->hb, hid, n, &L->w2);
        for (size_t i = 0; i < (size_t)n * dim; i++)
            t->x[i] = t->x[i] + t->xb[i];
    }

    /* Final norm and classifier for the rows that want logits, in passes of
     * up to TINY_CLS_ROWS rows. */
    int voc = c->vocab_size;
    int r = 0;
    while (r < n) {
        int take = 0;
        int idx[TINY_CLS_ROWS];
        for (; r < n && take < TINY_CLS_ROWS; r++) {
            if (rows[r].logits == NULL)
                continue;
            rmsnorm(t->xb + (size_t)take * dim, t->x + (size_t)r * dim, t->rms_final, dim);
            idx[take++] = r;
        }
        if (take == 0)
            break;
        kern_matmul(t->lg, voc, t->xb, dim, take, &t->wcls);
        for (int i = 0; i < take; i++)
            memcpy(rows[idx[i]].logits, t->lg + (size_t)i * voc, (size_t)voc * sizeof(float));
    }
}

static int tiny_prefill(struct backend *be, struct kv_pool *kv, const struct be_seq *seq,
                        const uint32_t *tokens, int n, struct be_out *out, float *logits_all)
{
    struct tiny *t = tiny_of(be);
    enum kv_dtype dt;
    int bs, rc;
    if (tokens == NULL)
        return TANDEM_EINVAL;
    if ((rc = check_pool(t, kv, &dt, &bs)) != 0 || (rc = check_seq(t, seq, n, bs)) != 0)
        return rc;
    for (int i = 0; i < n; i++)
        if (tokens[i] >= (uint32_t)t->cfg.vocab_size)
            return TANDEM_EINVAL;
    if ((rc = grow_rows(t, n)) != 0)
        return rc;
    for (int i = 0; i < n; i++) {
        t->rows[i].seq = seq;
        t->rows[i].pos = seq->pos + i;
        t->rows[i].token = tokens[i];
        t->rows[i].logits =
            logits_all != NULL ? logits_all + (size_t)i * (size_t)t->cfg.vocab_size : NULL;
    }
    float *last = out != NULL ? out->logits : NULL;
    if (logits_all == NULL)
        t->rows[n - 1].logits = last;
    forward(t, kv, dt, bs, n);
    if (out != NULL) {
        if (logits_all != NULL && last != NULL)
            memcpy(last, logits_all + (size_t)(n - 1) * (size_t)t->cfg.vocab_size,
                   (size_t)t->cfg.vocab_size * sizeof(float));
        out->token = 0;
        out->logprob = 0.0f;
    }
    return 0;
}

static int tiny_decode(struct backend *be, struct kv_pool *kv, int n_seqs,
                       const struct be_seq *seqs, struct be_out *out)
{
    struct tiny *t = tiny_of(be);
    enum kv_dtype dt;
    int bs, rc;
    if (n_seqs < 0 || (n_seqs > 0 && (seqs == NULL || out == NULL)))
        return TANDEM_EINVAL;
    if (n_seqs == 0)
        return 0;
    if ((rc = check_pool(t, kv, &dt, &bs)) != 0)
        return rc;
    for (int i = 0; i < n_seqs; i++) {
        if ((rc = check_seq(t, &seqs[i], 1, bs)) != 0)
            return rc;
        if (seqs[i].history == NULL || seqs[i].history[seqs[i].pos] >= (uint32_t)t->cfg.vocab_size)
            return TANDEM_EINVAL;
    }
    if ((rc = grow_rows(t, n_seqs)) != 0)
        return rc;
    for (int i = 0; i < n_seqs; i++) {
        t->rows[i].seq = &seqs[i];
        t->rows[i].pos = seqs[i].pos;
        t->rows[i].token = seqs[i].history[seqs[i].pos];
        t->rows[i].logits = out[i].logits;
        out[i].token = 0;
        out[i].logprob = 0.0f;
    }
    forward(t, kv, dt, bs, n_seqs);
    return 0;
}

static const struct backend_ops tiny_ops = {
    .name = TINY_BACKEND_NAME,
    .destroy = tiny_destroy,
    .prefill = tiny_prefill,
    .decode = tiny_decode,
    .step_end = NULL,
};

/* ---- the table entry (backend.h) ------------------------------------------- */

#define TINY_DEFAULT_BLOCKS 2048
/* Per-step work of the tiny backend is real CPU time on the loop thread, so
 * the budget bounds how long heartbeats and sockets wait; why 128
 * (measured): docs/performance.md, "The worker's token budget". The sim
 * sleeps its modelled step time, so it takes vLLM-sized steps. */
#define TINY_DEFAULT_BUDGET 128

static int desc_model_known(const char *model)
{
    return model != NULL && strcmp(model, TINY_MODEL) == 0;
}

static void desc_model_names(char *buf, size_t len)
{
    snprintf(buf, len, "%s", TINY_MODEL);
}

static int desc_create(struct backend **out, const struct backend_params *p, char *err,
                       size_t errlen)
{
    int rc;
    if (p->checkpoint != NULL) {
        if (p->model != NULL) {
            snprintf(err, errlen, "--model conflicts with --checkpoint (the file names it)");
            return TANDEM_EINVAL;
        }
        rc = tiny_load(out, p->checkpoint);
        if (rc != 0) {
            snprintf(err, errlen, "--checkpoint %s: %s", p->checkpoint, tandem_strerror(rc));
        }
        return rc;
    }
    if (p->model != NULL && !desc_model_known(p->model)) {
        snprintf(err, errlen,
                 "--model: unknown tiny model '%s' (the tiny backend has '" TINY_MODEL
                 "'; give --checkpoint FILE for others)",
                 p->model);
        return TANDEM_EINVAL;
    }
    struct tiny_config tc;
    tiny_default_config(&tc);
    rc = tiny_create(out, &tc);
    if (rc != 0) {
        snprintf(err, errlen, "tiny model: %s", tandem_strerror(rc));
    }
    return rc;
}

static int desc_kv_capacity(const struct backend *be, enum kv_dtype dt, int block_size,
                            int32_t *out, char *err, size_t errlen)
{
    (void)be;
    (void)dt;
    (void)block_size;
    (void)err;
    (void)errlen;
    *out = TINY_DEFAULT_BLOCKS;
    return 0;
}

const struct backend_desc tiny_backend = {
    .name = TINY_BACKEND_NAME,
    .ops = &tiny_ops,
    .reads = BACKEND_READS_FILES,
    .default_model = TINY_MODEL,
    .default_kv_dtype = KV_DTYPE_F32,
    .default_payload_div = 1,
    .default_token_budget = TINY_DEFAULT_BUDGET,
    .model_known = desc_model_known,
    .model_names = desc_model_names,
    .create = desc_create,
    .kv_capacity = desc_kv_capacity,
    .transfer_seconds = NULL,
    .time_scale = NULL,
};
