/* SPDX-License-Identifier: MIT */
/* A loaded checkpoint: lookups, restore into a model, destroy. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "error.h"
#include "tensor_seam.h"

/* An item pointer converts to a pointer to its first member, the name. */
static const char *item_name(const void *item)
{
    return *(const char *const *)item;
}

int sr__ckpt_cmp_items(const void *a, const void *b)
{
    return strcmp(item_name(*(void *const *)a), item_name(*(void *const *)b));
}

int sr__ckpt_cmp_key(const void *key, const void *item)
{
    return strcmp((const char *)key, item_name(*(void *const *)item));
}

static struct sr__ckpt_item *find(const sr_checkpoint *c, const char *name)
{
    void **hit = bsearch(name, c->by_name, c->n, sizeof(*c->by_name), sr__ckpt_cmp_key);
    return hit ? *hit : NULL;
}

SR_API void sr_checkpoint_destroy(sr_checkpoint *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->items && i < c->n; i++)
        sr_tensor_unref(c->items[i].t);
    free(c->items);
    free(c->meta);
    free(c->by_name);
    free(c->meta_by_name);
    free(c->names);
    free(c->path);
    free(c);
}

SR_API size_t sr_checkpoint_count(const sr_checkpoint *c)
{
    return c ? c->n : 0;
}

SR_API const char *sr_checkpoint_name(const sr_checkpoint *c, size_t i)
{
    return c && i < c->n ? c->items[i].name : NULL;
}

/* The tensor called name, borrowed; fn names the caller in errors. */
static sr_tensor *lookup(const sr_checkpoint *c, const char *name, const char *fn)
{
    if (!c || !name) {
        sr__fail(-EINVAL, fn, "%s is NULL", !c ? "checkpoint" : "name");
        return NULL;
    }
    struct sr__ckpt_item *it = find(c, name);
    if (!it) {
        sr__fail(-ENOENT, fn, "checkpoint %s has no tensor '%s'", c->path, name);
        return NULL;
    }
    return it->t;
}

SR_API sr_tensor *sr_checkpoint_tensor(const sr_checkpoint *c, const char *name)
{
    return lookup(c, name, "sr_checkpoint_tensor");
}

SR_API sr_tensor *sr_checkpoint_get(const sr_checkpoint *c, const char *name)
{
    return sr_tensor_ref(lookup(c, name, "sr_checkpoint_get"));
}

SR_API size_t sr_checkpoint_meta_count(const sr_checkpoint *c)
{
    return c ? c->nmeta : 0;
}

SR_API const char *sr_checkpoint_meta_name(const sr_checkpoint *c, size_t i)
{
    return c && i < c->nmeta ? c->meta[i].name : NULL;
}

SR_API int sr_checkpoint_meta(const sr_checkpoint *c, const char *name, int64_t *value)
{
    if (!c || !name || !value)
        return sr__fail(-EINVAL, "sr_checkpoint_meta", "%s is NULL", !c ? "checkpoint" : !name ? "name" : "value");
    void **hit = bsearch(name, c->meta_by_name, c->nmeta, sizeof(*c->meta_by_name), sr__ckpt_cmp_key);
    if (!hit)
        return sr__fail(-ENOENT, "sr_checkpoint_meta", "checkpoint %s has no metadata '%s'", c->path, name);
    *value = ((struct sr__ckpt_mitem *)*hit)->value;
    return 0;
}

/* dst[i] can take the checkpoint's tensor names[i] as it is. */
static int check_pair(const sr_checkpoint *c, const char *name, const sr_tensor *dst, sr_tensor **src)
{
    const char *fn = "sr_checkpoint_restore_into";
    if (!name || !dst)
        return sr__fail(-EINVAL, fn, "a %s is NULL", !name ? "name" : "destination tensor");
    struct sr__ckpt_item *it = find(c, name);
    if (!it)
        return sr__fail(-ENOENT, fn, "checkpoint %s has no tensor '%s'", c->path, name);
    const sr_tensor *s = it->t;
    sr_dtype sdt = sr_tensor_dtype(s), ddt = sr_tensor_dtype(dst);
    if (sdt != ddt)
        return sr__fail(-EINVAL, fn, "'%s' is %s in the checkpoint, %s in the model", name, sr_dtype_name(sdt),
                        sr_dtype_name(ddt));
    if (!sr__same_shape(s, dst)) {
        char a[SR_SHAPE_STR], b[SR_SHAPE_STR];
        return sr__fail(-EINVAL, fn, "'%s' has shape %s in the checkpoint, %s in the model", name,
                        sr__tensor_shape_str(s, a), sr__tensor_shape_str(dst, b));
    }
    if (sr_tensor_requires_grad(dst) && !sr_tensor_is_leaf(dst))
        return sr__fail(-EPERM, fn, "'%s' in the model is a non-leaf that requires grad; restore into its leaf",
                        name);
    *src = it->t;
    return 0;
}

SR_API int sr_checkpoint_restore_into(const sr_checkpoint *c, size_t n, const char *const *names,
                                      sr_tensor *const *dst)
{
    if (!c || (n && (!names || !dst)))
        return sr__fail(-EINVAL, "sr_checkpoint_restore_into", "%s is NULL",
                        !c ? "checkpoint" : !names ? "names" : "dst");
    sr_tensor **src = malloc((n ? n : 1) * sizeof(*src));
    if (!src)
        return sr__fail(-ENOMEM, "sr_checkpoint_restore_into", "no memory for %zu tensors", n);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = check_pair(c, names[i], dst[i], &src[i]);
    /* Grad mode off, as torch's load_state_dict: a leaf that requires grad
     * takes the values without recording history (-EPERM otherwise). */
    bool prev = sr_no_grad_enter();
    for (size_t i = 0; i < n && !rc; i++)
        rc = sr_copy_(dst[i], src[i]);
    sr_no_grad_exit(prev);
    free(src);
    return rc;
}

SR_API int sr_checkpoint_save_module(const char *path, const char *prefix, const sr_module *m, size_t nmeta,
                                     const char *const *meta_names, const int64_t *meta_values)
{
    size_t n;
    char **names;
    sr_tensor **ts;
    int rc = sr_module_state_dict(m, prefix, &n, &names, &ts);
    if (rc)
        return rc;
    rc = sr_checkpoint_save(path, n, (const char *const *)names, ts, nmeta, meta_names, meta_values);
    sr_module_state_free(n, names, ts);
    return rc;
}

SR_API int sr_checkpoint_load_module(const sr_checkpoint *c, const char *prefix, sr_module *m)
{
    if (!c || !m)
        return sr__fail(-EINVAL, "sr_checkpoint_load_module", "%s is NULL", !c ? "checkpoint" : "module");
    size_t n;
    char **names;
    sr_tensor **ts;
    int rc = sr_module_state_dict(m, prefix, &n, &names, &ts);
    if (rc)
        return rc;
    rc = sr_checkpoint_restore_into(c, n, (const char *const *)names, ts);
    sr_module_state_free(n, names, ts);
    return rc;
}
