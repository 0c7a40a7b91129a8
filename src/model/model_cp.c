/*
 * model_cp.c — context parallelism in the model layer (model.h): the positions of a CP rank's
 * rows and the blocks' attention through the hook the run installs (model_set_cp_hook), so
 * the model layer stays below the parallel one, which gathers the keys and values (cp.c).
 */
#include <stddef.h>
#include "model/arch.h"
#include "util/common.h"

static model_cp_att_fwd cp_fwd;
static model_cp_att_bwd cp_bwd;
static void *cp_ctx;

void model_set_cp_hook(model_cp_att_fwd fwd, model_cp_att_bwd bwd, void *ctx) {
    cp_fwd = fwd;
    cp_bwd = bwd;
    cp_ctx = ctx;
}

/* Local row t of T holds chunk cpr (t < T / 2) or chunk 2 cp - 1 - cpr of the 2 cp chunks of
 * T / 2 rows each that the whole sequence of cp T rows is cut into. */
int model_cp_pos(const model_config *c, int T, int t) {
    if (c->cp <= 1) return t;
    int cs = T / 2;
    return t < cs ? c->cpr * cs + t : (2 * c->cp - 1 - c->cpr) * cs + (t - cs);
}

int model_attention_fwd(const backend *be, const block_dims *d, float *out, float *att, const float *qkv, int NKV) {
    if (d->cfg->cp <= 1) return be->attention_gqa_fwd(out, att, qkv, d->B, d->T, d->NH, NKV, d->HS, d->doc);
    if (!cp_fwd) {
        pl_error("context parallelism: no CP group installed for the attention");
        return PL_EINVAL;
    }
    return cp_fwd(cp_ctx, out, att, qkv, d->B, d->T, d->NH, NKV, d->HS);
}

int model_attention_bwd(const backend *be, const block_dims *d, float *dqkv, const float *dout, const float *qkv,
                        const float *att, int NKV) {
    if (d->cfg->cp <= 1) return be->attention_gqa_bwd(dqkv, dout, qkv, att, d->B, d->T, d->NH, NKV, d->HS, d->doc);
    if (!cp_bwd) {
        pl_error("context parallelism: no CP group installed for the attention");
        return PL_EINVAL;
    }
    return cp_bwd(cp_ctx, dqkv, dout, qkv, att, d->B, d->T, d->NH, NKV, d->HS);
}
