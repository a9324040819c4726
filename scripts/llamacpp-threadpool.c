// llamacpp-threadpool.c is an LD_PRELOAD shim for scripts/bench-llamacpp.sh:
// it gives every llama.cpp context that node-llama-cpp creates a persistent
// ggml CPU threadpool, as llama.cpp's own tools (llama-cli, llama-bench)
// do. node-llama-cpp attaches none, so ggml creates and joins a fresh
// "disposable" threadpool for every graph it computes: one thread start per
// decoded token beyond the first thread, which on a small VM costs more than
// the token's arithmetic.
//
// It wraps llama_decode: before a context's first decode (or after its
// thread count changes) it makes a threadpool of llama_n_threads(ctx)
// threads with ggml_threadpool_new (looked up through the CPU backend's
// registry, as llama.cpp's common code does) and attaches it with
// llama_attach_threadpool, then calls the real llama_decode.
//
// LLAMACPP_THREADPOOL_POLL sets the pool's polling level (0 to 100,
// ggml's default 50); LLAMACPP_THREADPOOL_VERBOSE=1 logs each attach.
// LLAMACPP_BINS names the directory holding libllama / libggml (the
// prebuilt package's bins/linux-x64). Build against llama.cpp's headers:
//   cc -O2 -shared -fPIC -I SRC/include -I SRC/ggml/include
//      -o threadpool.so llamacpp-threadpool.c -ldl -lpthread
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"

typedef int32_t (*decode_fn)(struct llama_context *, struct llama_batch);
typedef int32_t (*n_threads_fn)(struct llama_context *);
typedef void (*attach_fn)(struct llama_context *, ggml_threadpool_t, ggml_threadpool_t);
typedef struct ggml_threadpool_params (*params_fn)(int);
typedef ggml_threadpool_t (*new_fn)(struct ggml_threadpool_params *);
typedef ggml_backend_reg_t (*reg_by_name_fn)(const char *);
typedef void *(*proc_fn)(ggml_backend_reg_t, const char *);

static decode_fn real_decode;
static n_threads_fn n_threads;
static attach_fn attach;
static params_fn params_default;
static reg_by_name_fn reg_by_name;
static proc_fn get_proc;
static new_fn pool_new;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

#define MAX_CONTEXTS 256
static struct {
	struct llama_context *ctx;
	int threads;
} attached[MAX_CONTEXTS];

// open_in_bins dlopens the first library in $LLAMACPP_BINS whose name
// starts with prefix (they carry version suffixes).
static void *open_in_bins(const char *prefix) {
	const char *dir = getenv("LLAMACPP_BINS");
	if (dir == NULL) {
		return NULL;
	}
	DIR *d = opendir(dir);
	if (d == NULL) {
		return NULL;
	}
	void *h = NULL;
	struct dirent *e;
	while (h == NULL && (e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strstr(e->d_name, ".so") != NULL) {
			char path[4096];
			snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
			h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
			if (h == NULL) {
				h = dlopen(path, RTLD_LAZY);
			}
		}
	}
	closedir(d);
	return h;
}

static void die(const char *what) {
	fprintf(stderr, "llamacpp-threadpool: %s\n", what);
	abort();
}

static void resolve(void) {
	void *llama = open_in_bins("libllama.");
	void *ggml = open_in_bins("libggml.");
	void *base = open_in_bins("libggml-base");
	if (llama == NULL || ggml == NULL || base == NULL) {
		die("cannot open libllama, libggml and libggml-base in $LLAMACPP_BINS");
	}
	real_decode = (decode_fn)dlsym(llama, "llama_decode");
	n_threads = (n_threads_fn)dlsym(llama, "llama_n_threads");
	attach = (attach_fn)dlsym(llama, "llama_attach_threadpool");
	reg_by_name = (reg_by_name_fn)dlsym(ggml, "ggml_backend_reg_by_name");
	get_proc = (proc_fn)dlsym(ggml, "ggml_backend_reg_get_proc_address");
	params_default = (params_fn)dlsym(base, "ggml_threadpool_params_default");
	if (!real_decode || !n_threads || !attach || !reg_by_name || !get_proc || !params_default) {
		die("a llama.cpp symbol is missing");
	}
}

int32_t llama_decode(struct llama_context *ctx, struct llama_batch batch) {
	pthread_mutex_lock(&mu);
	if (real_decode == NULL) {
		resolve();
	}
	if (pool_new == NULL) {
		ggml_backend_reg_t cpu = reg_by_name("CPU");
		if (cpu == NULL) {
			die("no CPU backend registered");
		}
		pool_new = (new_fn)get_proc(cpu, "ggml_threadpool_new");
		if (pool_new == NULL) {
			die("the CPU backend has no ggml_threadpool_new");
		}
	}
	int n = n_threads(ctx);
	int slot = -1;
	for (int i = 0; i < MAX_CONTEXTS; i++) {
		if (attached[i].ctx == ctx || (slot < 0 && attached[i].ctx == NULL)) {
			slot = i;
			if (attached[i].ctx == ctx) {
				break;
			}
		}
	}
	if (slot >= 0 && (attached[slot].ctx != ctx || attached[slot].threads != n)) {
		// The pool is never freed: contexts are few and short-lived in a
		// benchmark, and a freed context's address may be reused, which
		// only means a new pool is attached.
		struct ggml_threadpool_params p = params_default(n);
		const char *poll = getenv("LLAMACPP_THREADPOOL_POLL");
		if (poll != NULL) {
			p.poll = (uint32_t)atoi(poll);
		}
		ggml_threadpool_t pool = pool_new(&p);
		if (pool == NULL) {
			die("ggml_threadpool_new failed");
		}
		attach(ctx, pool, pool);
		attached[slot].ctx = ctx;
		attached[slot].threads = n;
		if (getenv("LLAMACPP_THREADPOOL_VERBOSE") != NULL) {
			fprintf(stderr, "llamacpp-threadpool: attached a %d-thread pool to context %p\n", n, (void *)ctx);
		}
	}
	pthread_mutex_unlock(&mu);
	return real_decode(ctx, batch);
}
