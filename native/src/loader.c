/*
 * Symbol resolution: dlsym, dlopen and dlmopen, as applications and plugins reach the driver.
 *
 *  - dlsym(handle, name) returns the hook for a hooked name, whatever the handle, RTLD_NEXT
 *    included (from any object: a library that looks for "the next cuMemAlloc_v2" gets the
 *    hook, which calls the driver). Other names are forwarded with a sibling call, so glibc
 *    still sees the caller's return address (RTLD_NEXT is relative to the caller).
 *  - dlopen(file, RTLD_DEEPBIND): a deep-bound object looks up symbols in its own dependencies
 *    (libcuda.so.1, libc's dlsym) before the global scope, past the preloaded hooks. After such
 *    a load, every object it brought in has its references (PLT/GOT slots and absolute data
 *    relocations) to hooked names, dlsym, dlopen and dlmopen pointed at the hooks.
 *    Without RTLD_DEEPBIND, dlopen is forwarded with a sibling call (caller semantics kept).
 *  - dlmopen into a namespace other than the base one is refused under a claim: a new
 *    namespace loads its own libcuda.so.1 and libc, which no hook in this namespace reaches.
 *
 * libc's functions themselves come from resolve.c. The code on the dlsym path runs before
 * constructors (sanitizer runtimes call dlsym while initialising), so it is not instrumented
 * and calls no libc string functions.
 */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hooks.h"

TS_EXPORT void *dlsym(void *handle, const char *name);
TS_EXPORT void *dlopen(const char *file, int mode);
TS_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode);

TS_NOSAN void *ts_hook_by_name(const char *name)
{
    if (!name)
        return NULL;
    if (name[0] == 'c' && name[1] == 'u') {
        for (int i = 0; i < H_CUDA_COUNT; i++)
            if (ts_streq(ts_hooks[i].name, name))
                return ts_hook_fns[i];
    } else if (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l') {
        for (int i = 0; ts_nvml_hooks[i].name; i++)
            if (ts_streq(ts_nvml_hooks[i].name, name))
                return ts_nvml_hook_fns[i];
    } else if (name[0] == 'd' && name[1] == 'l') {
        if (ts_streq(name, "dlsym"))
            return (void *)&dlsym;
        if (ts_streq(name, "dlopen"))
            return (void *)&dlopen;
        if (ts_streq(name, "dlmopen"))
            return (void *)&dlmopen;
    }
    return NULL;
}

/* ---- dlsym ---- */

TS_NOSAN static void *dlsym_other(void *handle, const char *name) __attribute__((noinline));

TS_NOSAN __attribute__((optimize("optimize-sibling-calls"))) TS_EXPORT void *dlsym(void *handle,
                                                                          const char *name)
{
    if (handle == RTLD_NEXT) {
        void *h = ts_hook_by_name(name);
        if (h)
            return h;
        /* RTLD_NEXT is relative to the caller's object, which glibc finds from the return
         * address: forward with a sibling call so that it is still the application's. */
        return ts_real_dlsym_fn()(handle, name);
    }
    return dlsym_other(handle, name);
}

TS_NOSAN static void *dlsym_other(void *handle, const char *name)
{
    void *r = ts_real_dlsym_fn()(handle, name);
    if (r) {
        void *h = ts_hook_by_name(name);
        if (h)
            return h;
    }
    return r;
}

/* ---- RTLD_DEEPBIND: redirect the new objects' references to the hooks ---- */

#if defined(__x86_64__)
#define R_GLOB_DAT R_X86_64_GLOB_DAT
#define R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define R_ABS64 R_X86_64_64
#elif defined(__aarch64__)
#define R_GLOB_DAT R_AARCH64_GLOB_DAT
#define R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define R_ABS64 R_AARCH64_ABS64
#endif

typedef struct loaded {
    ElfW(Addr) base;
    const char *name;
} loaded;

struct snapshot {
    loaded *v;
    size_t n, cap;
};

static int note_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct snapshot *s = data;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        loaded *nv = realloc(s->v, nc * sizeof(*nv));
        if (!nv)
            return 1;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = (loaded){info->dlpi_addr, info->dlpi_name};
    return 0;
}

static int contains(const char *hay, const char *needle)
{
    return hay && strstr(hay, needle) != NULL;
}

#ifdef R_GLOB_DAT
static ElfW(Addr) dyn_ptr(ElfW(Addr) base, ElfW(Addr) v) { return v < base ? v + base : v; }

/* Point slot at value, making a RELRO page writable for the write. */
static void write_slot(void **slot, void *value, ElfW(Addr) relro, size_t relro_len)
{
    if (*slot == value)
        return;
    uintptr_t a = (uintptr_t)slot;
    long page = sysconf(_SC_PAGESIZE);
    int ro = relro_len && a >= relro && a < relro + relro_len;
    uintptr_t pg = a & ~((uintptr_t)page - 1);
    if (ro && mprotect((void *)pg, (size_t)page, PROT_READ | PROT_WRITE) != 0) {
        ts_log(TS_ERR, "cannot redirect a deep-bound reference: mprotect: %s", strerror(errno));
        return;
    }
    *slot = value;
    if (ro)
        mprotect((void *)pg, (size_t)page, PROT_READ);
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct snapshot *before = data;
    for (size_t i = 0; i < before->n; i++)
        if (before->v[i].base == info->dlpi_addr && before->v[i].name == info->dlpi_name)
            return 0; /* loaded before this dlopen */
    const char *name = info->dlpi_name;
    if (contains(name, "libcuda.so") || contains(name, "libnvidia-ml.so") ||
        contains(name, "libtessera-enforce"))
        return 0;
    ElfW(Addr) base = info->dlpi_addr, relro = 0;
    size_t relro_len = 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(base + info->dlpi_phdr[i].p_vaddr);
        else if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
            relro = base + info->dlpi_phdr[i].p_vaddr;
            relro_len = info->dlpi_phdr[i].p_memsz;
        }
    }
    if (!dyn)
        return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t pltsz = 0, relasz = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB:
            symtab = (const ElfW(Sym) *)dyn_ptr(base, d->d_un.d_ptr);
            break;
        case DT_STRTAB:
            strtab = (const char *)dyn_ptr(base, d->d_un.d_ptr);
            break;
        case DT_JMPREL:
            jmprel = (const ElfW(Rela) *)dyn_ptr(base, d->d_un.d_ptr);
            break;
        case DT_PLTRELSZ:
            pltsz = d->d_un.d_val;
            break;
        case DT_RELA:
            rela = (const ElfW(Rela) *)dyn_ptr(base, d->d_un.d_ptr);
            break;
        case DT_RELASZ:
            relasz = d->d_un.d_val;
            break;
        default:
            break;
        }
    }
    if (!symtab || !strtab)
        return 0;
    const ElfW(Rela) *tabs[2] = {jmprel, rela};
    size_t counts[2] = {pltsz / sizeof(ElfW(Rela)), relasz / sizeof(ElfW(Rela))};
    int patched = 0;
    for (int t = 0; t < 2; t++) {
        for (size_t k = 0; tabs[t] && k < counts[t]; k++) {
            const ElfW(Rela) *r = &tabs[t][k];
            unsigned long type = ELF64_R_TYPE(r->r_info);
            unsigned long si = ELF64_R_SYM(r->r_info);
            if ((type != R_GLOB_DAT && type != R_JUMP_SLOT && type != R_ABS64) || si == 0)
                continue;
            const ElfW(Sym) *s = &symtab[si];
            if (s->st_shndx != SHN_UNDEF)
                continue; /* the object's own definition */
            void *h = ts_hook_by_name(strtab + s->st_name);
            if (!h)
                continue;
            void *value = (char *)h + (type == R_ABS64 ? r->r_addend : 0);
            write_slot((void **)(base + r->r_offset), value, relro, relro_len);
            patched++;
        }
    }
    if (patched)
        ts_log(TS_INFO, "deep-bound %s: %d reference(s) redirected to the hooks",
               name && *name ? name : "(object)", patched);
    return 0;
}
#endif

/* Where a bare name would be found through the caller's RPATH/RUNPATH (dlopen searches the
 * calling object's own paths, which are lost once the call goes through this library). */
static const char *caller_search(const char *file, const void *caller, char *buf, size_t len)
{
    if (!file || strchr(file, '/'))
        return NULL;
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm || !lm->l_ld)
        return NULL;
    const char *strtab = NULL, *paths = NULL;
    ElfW(Addr) base = lm->l_addr;
    ElfW(Xword) off = 0;
    int have = 0;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_STRTAB)
            strtab = (const char *)(d->d_un.d_ptr < base ? d->d_un.d_ptr + base : d->d_un.d_ptr);
        else if (d->d_tag == DT_RUNPATH || (d->d_tag == DT_RPATH && !have)) {
            off = d->d_un.d_val;
            have = 1;
        }
    }
    if (!strtab || !have)
        return NULL;
    paths = strtab + off;
    char origin[4096];
    const char *obj = lm->l_name && *lm->l_name ? lm->l_name : NULL;
    if (obj) {
        snprintf(origin, sizeof(origin), "%s", obj);
    } else {
        ssize_t n = readlink("/proc/self/exe", origin, sizeof(origin) - 1);
        origin[n > 0 ? n : 0] = '\0';
    }
    char *slash = strrchr(origin, '/');
    if (slash)
        *slash = '\0';
    while (*paths) {
        const char *end = strchr(paths, ':');
        size_t n = end ? (size_t)(end - paths) : strlen(paths);
        char dir[4096];
        int k;
        if (n >= 7 && strncmp(paths, "$ORIGIN", 7) == 0)
            k = snprintf(dir, sizeof(dir), "%s%.*s", origin, (int)(n - 7), paths + 7);
        else
            k = snprintf(dir, sizeof(dir), "%.*s", (int)n, paths);
        if (k < 0 || (size_t)k >= sizeof(dir) ||
            (size_t)snprintf(buf, len, "%s/%s", dir, file) >= len) {
            paths += n + (end ? 1 : 0);
            continue;
        }
        if (access(buf, R_OK) == 0)
            return buf;
        paths += n + (end ? 1 : 0);
    }
    return NULL;
}

static void *deepbind_open(void *(*open_fn)(void *, const char *, int), void *ctx,
                           const char *file, int mode, const void *caller)
{
    int active = ts_active();
    struct snapshot before = {NULL, 0, 0};
    if (active)
        dl_iterate_phdr(note_object, &before);
    char buf[4096];
    const char *path = caller_search(file, caller, buf, sizeof(buf));
    void *h = open_fn(ctx, path ? path : file, mode);
#ifdef R_GLOB_DAT
    if (h && active)
        dl_iterate_phdr(patch_object, &before);
#else
    if (h && active) {
        ts_log(TS_ERR, "RTLD_DEEPBIND is not supported on this architecture under a GPU claim");
        dlclose(h);
        h = NULL;
    }
#endif
    free(before.v);
    return h;
}

static void *open_base(void *ctx, const char *file, int mode)
{
    (void)ctx;
    return ts_real_dlopen_fn()(file, mode);
}

static void *open_ns(void *ctx, const char *file, int mode)
{
    return ts_real_dlmopen_fn()(*(Lmid_t *)ctx, file, mode);
}

TS_NOSAN __attribute__((optimize("optimize-sibling-calls"))) TS_EXPORT void *dlopen(const char *file,
                                                                           int mode)
{
    if (TS_LIKELY(!(mode & RTLD_DEEPBIND)))
        return ts_real_dlopen_fn()(file, mode); /* sibling call: glibc still sees the caller */
    return deepbind_open(open_base, NULL, file, mode, __builtin_return_address(0));
}

/* Leaves a dlerror() message saying why. */
static void *refuse_namespace(void)
{
    ts_log(TS_ERR, "dlmopen into another link-map namespace refused: that namespace would load "
                   "its own libcuda.so.1, which the enforcement library cannot reach");
    return ts_real_dlopen_fn()("/tessera: dlmopen into another link-map namespace is refused under a GPU "
                         "claim",
                         RTLD_NOW);
}

static void *dlmopen_checked(Lmid_t lmid, const char *file, int mode, const void *caller)
{
    if (lmid != LM_ID_BASE)
        return refuse_namespace();
    return deepbind_open(open_ns, &lmid, file, mode, caller);
}

TS_NOSAN __attribute__((optimize("optimize-sibling-calls"))) TS_EXPORT void *
dlmopen(Lmid_t lmid, const char *file, int mode)
{
    if (TS_LIKELY(lmid == LM_ID_BASE && !(mode & RTLD_DEEPBIND)) ||
        (lmid != LM_ID_BASE && !ts_active()))
        return ts_real_dlmopen_fn()(lmid, file, mode); /* sibling call */
    return dlmopen_checked(lmid, file, mode, __builtin_return_address(0));
}
