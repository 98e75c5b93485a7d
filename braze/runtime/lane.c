/* braze's jit fast lane in C: the guard-and-run of one direct replay (runtime/lane.py).

A small shape's jitted call costs its kernel plus the Python around it; this is that
Python as C, the way torch.compile moved its guards to C++. A Lane is built in Python
(jit._Fast) from what the Python lane checks and does, and holds it as data:

  - per argument, what it must be: a tensor's exact type, dtype, device, layout, pending
    and read-only state, not a captured storage, or a plain value's type and value
    (floats by their bits, every nan one value);
  - guards: attributes of braze's own objects that must still be what they were when
    the lane was built (the stream empty, the recording still flushed alone, the plan
    still the stored one, a captured tensor's array still the same one ...);
  - the run: the fresh storages to allocate (through memory.allocate_at: one pool),
    each kernel's argument array with the moving slots to fill, the counters to bump,
    the result to build.

Anything that differs returns `miss` and the caller takes the Python way, which sees
the same state and decides as it always does. Exceptions from braze's Python (an
allocation over the memory budget) propagate unchanged. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef void (*braze_kernel)(void **args, int64_t nthreads);

/* dict operations by a hash already known, where CPython exports them (3.11, 3.12) */
#if PY_VERSION_HEX < 0x030D0000
#define KNOWN_GET(d, k, h) _PyDict_GetItem_KnownHash((d), (k), (h))
#define KNOWN_DEL(d, k, h) _PyDict_DelItem_KnownHash((d), (k), (h))
#define KNOWN_SET(d, k, v, h) _PyDict_SetItem_KnownHash((d), (k), (v), (h))
#else
#define KNOWN_GET(d, k, h) PyDict_GetItemWithError((d), (k))
#define KNOWN_DEL(d, k, h) PyDict_DelItem((d), (k))
#define KNOWN_SET(d, k, v, h) PyDict_SetItem((d), (k), (v))
#endif

enum { G_IS = 0, G_FALSY = 1, G_GT = 2, G_WEAK = 3, G_ITEM = 4 };

typedef struct {
    int kind;
    PyObject *obj, *name, *want, *key; /* key: G_ITEM's, else NULL */
} Guard;

typedef struct {
    int tensor;                        /* 1: a tensor; 0: a plain value */
    PyObject *dtype, *device, *layout; /* a tensor's (borrowed from `spec`) */
    int pending, readonly;
    PyObject *value;                   /* a value's */
} Expect;

typedef struct {
    braze_kernel fn;
    Py_ssize_t nargs;                  /* entries in `fixed` (buffers, then the trailing sizes) */
    uint64_t *fixed;
    Py_ssize_t nmov;
    Py_ssize_t *mov_at, *mov_slot;
    int64_t *mov_shift;
} Step;

typedef struct {
    PyObject_HEAD
    PyObject *spec;                    /* the tuple it was built from: owns every object below */
    PyObject *miss, *tensor_type, *captured_ids, *rec, *counters, *shapes, *program, *threads;
    Py_hash_t program_hash;
    PyObject *storage_type, *allocate, *rebuild, *result_spec, *result_layout;
    Py_ssize_t nexpect, ntensors, nguards, nslots, nfresh, nsteps, result_slot, launches;
    int ready;                         /* lane_init finished: only then may it be called */
    Expect *expect;
    Guard *guards;
    Py_ssize_t *arg_slot;              /* per argument: its rel id slot, or -1 */
    Py_ssize_t *fresh_slot;
    PyObject **fresh_spec, **fresh_alloc;
    Step *steps;
} Lane;

static PyObject *s_probe_every, *s_num_threads, *s_get_num_threads, *s_storage, *s_layout, *s_dtype, *s_device, *s_array, *s_readonly, *s_address, *s_bind,
    *s_direct_runs, *s_address_fn, *s_flushes, *s_plan_hits, *s_kernel_launches, *s_c_calls;

static void lane_free_parts(Lane *self) {
    if (self->steps) {
        for (Py_ssize_t i = 0; i < self->nsteps; i++) {
            PyMem_Free(self->steps[i].fixed);
            PyMem_Free(self->steps[i].mov_at);
            PyMem_Free(self->steps[i].mov_slot);
            PyMem_Free(self->steps[i].mov_shift);
        }
    }
    PyMem_Free(self->steps);
    PyMem_Free(self->expect);
    PyMem_Free(self->guards);
    PyMem_Free(self->arg_slot);
    PyMem_Free(self->fresh_slot);
    PyMem_Free(self->fresh_spec);
    PyMem_Free(self->fresh_alloc);
    self->steps = NULL;
    self->expect = NULL;
    self->guards = NULL;
    self->arg_slot = self->fresh_slot = NULL;
    self->fresh_spec = self->fresh_alloc = NULL;
}

static void lane_dealloc(Lane *self) {
    lane_free_parts(self);
    Py_XDECREF(self->spec);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* `t`, checked to be a tuple of at least `least` and at most `most` items. */
static PyObject *tuple_of(PyObject *t, Py_ssize_t least, Py_ssize_t most, const char *what) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < least || PyTuple_GET_SIZE(t) > most) {
        PyErr_Format(PyExc_TypeError, "lane: %s must be a tuple of %zd to %zd items", what, least, most);
        return NULL;
    }
    return t;
}
#define ANY PY_SSIZE_T_MAX

#define ITEM(t, i) PyTuple_GET_ITEM((t), (i))

/* Lane(spec): spec is
   (miss, tensor_type, captured_ids, rec, counters, shapes, program, threads (the module),
    storage_type, allocate, rebuild, result_spec, result_slot, result_layout,
    expect, guards, nslots, arg_slots, fresh, steps)
   expect: per argument (1, dtype, device, layout, pending, readonly) or (0, value)
   guards: (kind, obj, name, want, key)
   fresh:  (slot, storage spec tuple, allocate args tuple)
   steps:  (fn address, fixed bytes, ((at, slot, shift), ...)) */
static int lane_init(Lane *self, PyObject *args, PyObject *kw) {
    PyObject *spec;
    if (self->spec) { /* a call may be running its kernels on another thread: never torn down */
        PyErr_SetString(PyExc_TypeError, "lane: a Lane is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &spec)) return -1;
    if (!tuple_of(spec, 20, 20, "spec")) return -1;
    Py_INCREF(spec);
    self->spec = spec;
    self->miss = ITEM(spec, 0);
    self->tensor_type = ITEM(spec, 1);
    self->captured_ids = ITEM(spec, 2);
    self->rec = ITEM(spec, 3);
    self->counters = ITEM(spec, 4);
    self->shapes = ITEM(spec, 5);
    self->program = ITEM(spec, 6);
    self->threads = ITEM(spec, 7);
    self->program_hash = PyObject_Hash(self->program);
    if (self->program_hash == -1) return -1;
    self->storage_type = ITEM(spec, 8);
    self->allocate = ITEM(spec, 9);
    self->rebuild = ITEM(spec, 10);
    self->result_spec = ITEM(spec, 11);
    self->result_slot = PyLong_AsSsize_t(ITEM(spec, 12));
    self->result_layout = ITEM(spec, 13);
    self->nslots = PyLong_AsSsize_t(ITEM(spec, 16));
    if (PyErr_Occurred()) return -1;
    if (!PyDict_Check(self->counters) || !PyDict_Check(self->shapes) || !PyAnySet_Check(self->captured_ids)) {
        PyErr_SetString(PyExc_TypeError, "lane: bad counters, shapes or captured ids");
        return -1;
    }

    PyObject *expect = tuple_of(ITEM(spec, 14), 0, ANY, "expect");
    PyObject *arg_slots = tuple_of(ITEM(spec, 17), 0, ANY, "arg_slots");
    if (!expect || !arg_slots) return -1;
    self->nexpect = PyTuple_GET_SIZE(expect);
    if (PyTuple_GET_SIZE(arg_slots) != self->nexpect) {
        PyErr_SetString(PyExc_TypeError, "lane: one slot per argument");
        return -1;
    }
    self->expect = PyMem_Calloc(self->nexpect + 1, sizeof(Expect));
    self->arg_slot = PyMem_Calloc(self->nexpect + 1, sizeof(Py_ssize_t));
    if (!self->expect || !self->arg_slot) { PyErr_NoMemory(); return -1; }
    self->ntensors = 0;
    for (Py_ssize_t i = 0; i < self->nexpect; i++) {
        PyObject *e = tuple_of(ITEM(expect, i), 2, 6, "an expectation");
        if (!e) return -1;
        Expect *x = &self->expect[i];
        x->tensor = PyObject_IsTrue(ITEM(e, 0));
        if (x->tensor) {
            if (!tuple_of(e, 6, 6, "a tensor's expectation")) return -1;
            x->dtype = ITEM(e, 1);
            x->device = ITEM(e, 2);
            x->layout = ITEM(e, 3);
            x->pending = PyObject_IsTrue(ITEM(e, 4));
            x->readonly = PyObject_IsTrue(ITEM(e, 5));
            self->ntensors++;
        } else {
            x->value = ITEM(e, 1);
        }
        self->arg_slot[i] = PyLong_AsSsize_t(ITEM(arg_slots, i));
        if (self->arg_slot[i] >= self->nslots) { PyErr_SetString(PyExc_ValueError, "lane: slot out of range"); return -1; }
    }

    PyObject *guards = tuple_of(ITEM(spec, 15), 0, ANY, "guards");
    if (!guards) return -1;
    self->nguards = PyTuple_GET_SIZE(guards);
    self->guards = PyMem_Calloc(self->nguards + 1, sizeof(Guard));
    if (!self->guards) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < self->nguards; i++) {
        PyObject *g = tuple_of(ITEM(guards, i), 5, 5, "a guard");
        if (!g) return -1;
        Guard *x = &self->guards[i];
        x->kind = (int)PyLong_AsLong(ITEM(g, 0));
        x->obj = ITEM(g, 1);
        x->name = ITEM(g, 2);
        x->want = ITEM(g, 3);
        x->key = ITEM(g, 4);
        if (!PyUnicode_Check(x->name) || x->kind < G_IS || x->kind > G_ITEM
            || (x->kind == G_WEAK && !PyWeakref_CheckRef(x->want))) {
            PyErr_SetString(PyExc_TypeError, "lane: bad guard");
            return -1;
        }
    }

    PyObject *fresh = tuple_of(ITEM(spec, 18), 0, ANY, "fresh");
    if (!fresh) return -1;
    self->nfresh = PyTuple_GET_SIZE(fresh);
    self->fresh_slot = PyMem_Calloc(self->nfresh + 1, sizeof(Py_ssize_t));
    self->fresh_spec = PyMem_Calloc(self->nfresh + 1, sizeof(PyObject *));
    self->fresh_alloc = PyMem_Calloc(self->nfresh + 1, sizeof(PyObject *));
    if (!self->fresh_slot || !self->fresh_spec || !self->fresh_alloc) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < self->nfresh; i++) {
        PyObject *f = tuple_of(ITEM(fresh, i), 3, 3, "a fresh storage");
        if (!f || !tuple_of(ITEM(f, 1), 1, ANY, "a storage spec") || !tuple_of(ITEM(f, 2), 1, ANY, "allocate's arguments"))
            return -1;
        self->fresh_slot[i] = PyLong_AsSsize_t(ITEM(f, 0));
        if (self->fresh_slot[i] < 0 || self->fresh_slot[i] >= self->nslots) {
            PyErr_SetString(PyExc_ValueError, "lane: slot out of range");
            return -1;
        }
        self->fresh_spec[i] = ITEM(f, 1);
        self->fresh_alloc[i] = ITEM(f, 2);
    }

    PyObject *steps = tuple_of(ITEM(spec, 19), 1, ANY, "steps");
    if (!steps) return -1;
    self->nsteps = PyTuple_GET_SIZE(steps);
    self->steps = PyMem_Calloc(self->nsteps, sizeof(Step));
    if (!self->steps) { PyErr_NoMemory(); return -1; }
    self->launches = self->nsteps;
    for (Py_ssize_t i = 0; i < self->nsteps; i++) {
        PyObject *s = tuple_of(ITEM(steps, i), 3, 3, "a step");
        if (!s || !PyBytes_Check(ITEM(s, 1)) || !tuple_of(ITEM(s, 2), 0, ANY, "a step's moving slots")) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "lane: a step's fixed arguments must be bytes");
            return -1;
        }
        Step *x = &self->steps[i];
        x->fn = (braze_kernel)PyLong_AsVoidPtr(ITEM(s, 0));
        Py_ssize_t nbytes = PyBytes_GET_SIZE(ITEM(s, 1));
        if (!x->fn || nbytes % 8) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "lane: bad kernel address or arguments");
            return -1;
        }
        x->nargs = nbytes / 8;
        x->fixed = PyMem_Malloc(nbytes + 8);
        if (!x->fixed) { PyErr_NoMemory(); return -1; }
        memcpy(x->fixed, PyBytes_AS_STRING(ITEM(s, 1)), nbytes);
        PyObject *mov = ITEM(s, 2);
        x->nmov = PyTuple_GET_SIZE(mov);
        x->mov_at = PyMem_Calloc(x->nmov + 1, sizeof(Py_ssize_t));
        x->mov_slot = PyMem_Calloc(x->nmov + 1, sizeof(Py_ssize_t));
        x->mov_shift = PyMem_Calloc(x->nmov + 1, sizeof(int64_t));
        if (!x->mov_at || !x->mov_slot || !x->mov_shift) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t j = 0; j < x->nmov; j++) {
            PyObject *m = tuple_of(ITEM(mov, j), 3, 3, "a moving slot");
            if (!m) return -1;
            x->mov_at[j] = PyLong_AsSsize_t(ITEM(m, 0));
            x->mov_slot[j] = PyLong_AsSsize_t(ITEM(m, 1));
            x->mov_shift[j] = PyLong_AsLongLong(ITEM(m, 2));
            if (PyErr_Occurred()) return -1;
            if (x->mov_at[j] < 0 || x->mov_at[j] >= x->nargs || x->mov_slot[j] < 0 || x->mov_slot[j] >= self->nslots) {
                PyErr_SetString(PyExc_ValueError, "lane: moving slot out of range");
                return -1;
            }
        }
    }
    if (self->result_slot >= self->nslots) { PyErr_SetString(PyExc_ValueError, "lane: result slot out of range"); return -1; }
    if (PyErr_Occurred()) return -1;
    self->ready = 1;
    return 0;
}

/* what a weak reference points to (a new reference), or NULL once it is dead */
static PyObject *weak_target(PyObject *ref) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0) PyErr_Clear();
    return target;
#else
    PyObject *target = PyWeakref_GetObject(ref); /* borrowed; None once dead */
    if (target == Py_None) return NULL;
    Py_INCREF(target);
    return target;
#endif
}

/* 1: the guard holds, 0: it does not, -1: an exception. */
static int guard_holds(const Guard *g) {
    PyObject *v = PyObject_GetAttr(g->obj, g->name);
    if (!v) return -1;
    int ok;
    switch (g->kind) {
    case G_IS: ok = v == g->want; break;
    case G_FALSY: ok = PyObject_Not(v); break;
    case G_GT: ok = PyObject_RichCompareBool(v, g->want, Py_GT); break;
    case G_WEAK: {
        PyObject *target = weak_target(g->want);
        ok = target != NULL && v == target;
        Py_XDECREF(target);
        break;
    }
    default: /* G_ITEM */
        if (!PyDict_Check(v)) ok = 0;
        else {
            PyObject *item = PyDict_GetItemWithError(v, g->key);
            ok = item == g->want;
            if (!item && PyErr_Occurred()) ok = -1;
        }
    }
    Py_DECREF(v);
    return ok;
}

/* 1: `x` is the value `want` (same exact type; floats by their bits), 0: not, -1: error. */
static int same_value(PyObject *x, PyObject *want) {
    if (Py_TYPE(x) != Py_TYPE(want)) return 0;
    if (x == want) return 1;
    if (PyFloat_CheckExact(x)) { /* by its bits (-0.0 is not 0.0), every nan one value: jit's key (float.hex) */
        double a = PyFloat_AS_DOUBLE(x), b = PyFloat_AS_DOUBLE(want);
        return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0;
    }
    return PyObject_RichCompareBool(x, want, Py_EQ);
}

static int bump(PyObject *counters, PyObject *key, Py_ssize_t by) {
    PyObject *v = PyDict_GetItemWithError(counters, key);
    if (!v) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    Py_ssize_t was = PyLong_AsSsize_t(v);
    if (was == -1 && PyErr_Occurred()) return -1;
    PyObject *n = PyLong_FromSsize_t(was + by);
    if (!n) return -1;
    int r = PyDict_SetItem(counters, key, n);
    Py_DECREF(n);
    return r;
}

/* A storage's array address (Storage._address, found through Storage.address() when 0). */
static int storage_address(PyObject *st, uint64_t *out) {
    PyObject *a = PyObject_GetAttr(st, s_address);
    if (!a) return -1;
    uint64_t v = (uint64_t)PyLong_AsUnsignedLongLongMask(a);
    Py_DECREF(a);
    if (v == 0) {
        if (PyErr_Occurred()) return -1;
        a = PyObject_CallMethodNoArgs(st, s_address_fn);
        if (!a) return -1;
        v = (uint64_t)PyLong_AsUnsignedLongLongMask(a);
        Py_DECREF(a);
        if (PyErr_Occurred()) return -1;
    }
    *out = v;
    return 0;
}

/* getattr(obj, name) is `want` (or == it, with `equal`): 1, 0, or -1 on an exception */
static int attr_matches(PyObject *obj, PyObject *name, PyObject *want, int equal) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return -1;
    int ok = equal ? PyObject_RichCompareBool(v, want, Py_EQ) : v == want;
    Py_DECREF(v);
    return ok;
}

/* bool(getattr(obj, name)) is `want`: 1, 0, or -1 on an exception */
static int attr_truth(PyObject *obj, PyObject *name, int want) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return -1;
    int ok = PyObject_IsTrue(v);
    Py_DECREF(v);
    return ok < 0 ? -1 : ok == want;
}

#define MISS_IF(c) do { if (c) { out = self->miss; Py_INCREF(out); goto done; } } while (0)
#define FAIL_IF(c) do { if (c) { out = NULL; goto done; } } while (0)
/* a check's 1 goes on, 0 is a miss, -1 an exception */
#define CHECK(x) do { int r_ = (x); FAIL_IF(r_ < 0); MISS_IF(!r_); } while (0)

static PyObject *lane_call(Lane *self, PyObject *args, PyObject *kw) {
    PyObject *call;
    if (kw || !PyArg_UnpackTuple(args, "lane", 1, 1, &call) || !PyTuple_Check(call)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "lane(args): one tuple, no keywords");
        return NULL;
    }
    if (!self->ready) {
        PyErr_SetString(PyExc_TypeError, "lane: not initialised");
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t nslots = self->nslots;
    PyObject **slot = PyMem_Calloc(nslots + 1, sizeof(PyObject *)); /* owned references */
    PyObject **argst = PyMem_Calloc(self->nexpect + 1, sizeof(PyObject *));
    uint64_t *ptrs = NULL;
    PyObject **held = NULL;
    Py_ssize_t nheld = 0;
    if (!slot || !argst) { PyMem_Free(slot); PyMem_Free(argst); return PyErr_NoMemory(); }

    /* the arguments */
    MISS_IF(PyTuple_GET_SIZE(call) != self->nexpect);
    for (Py_ssize_t i = 0; i < self->nexpect; i++) {
        PyObject *a = PyTuple_GET_ITEM(call, i);
        const Expect *e = &self->expect[i];
        if (!e->tensor) {
            CHECK(same_value(a, e->value));
            continue;
        }
        MISS_IF((PyObject *)Py_TYPE(a) != self->tensor_type);
        PyObject *st = argst[i] = PyObject_GetAttr(a, s_storage);
        FAIL_IF(!st);
        CHECK(attr_matches(st, s_dtype, e->dtype, 0));
        CHECK(attr_matches(st, s_device, e->device, 1));
        CHECK(attr_matches(a, s_layout, e->layout, 1));
        int none = attr_matches(st, s_array, Py_None, 0); /* pending: no array yet */
        CHECK(none < 0 ? -1 : none == e->pending);
        CHECK(attr_truth(st, s_readonly, e->readonly));
        PyObject *id = PyLong_FromVoidPtr(st); /* id(st) */
        FAIL_IF(!id);
        int captured = PySet_Contains(self->captured_ids, id);
        Py_DECREF(id);
        CHECK(captured < 0 ? -1 : !captured);
        for (Py_ssize_t j = 0; j < i; j++) /* each tensor its own storage, as recorded */
            MISS_IF(argst[j] == st);
    }

    /* the state the replay was built in */
    for (Py_ssize_t i = 0; i < self->nguards; i++) CHECK(guard_holds(&self->guards[i]));
    PyObject *runs = PyObject_GetAttr(self->rec, s_direct_runs);
    FAIL_IF(!runs);
    Py_ssize_t n = PyLong_AsSsize_t(runs);
    Py_DECREF(runs);
    FAIL_IF(n == -1 && PyErr_Occurred());
    PyObject *every = PyObject_GetAttr(self->rec, s_probe_every);
    FAIL_IF(!every);
    Py_ssize_t probe = PyLong_AsSsize_t(every);
    Py_DECREF(every);
    FAIL_IF(probe == -1 && PyErr_Occurred());
    MISS_IF(probe <= 0 || (n + 1) % probe == 0); /* a probe's turn records instead (jit.REPROBE) */
    runs = PyLong_FromSsize_t(n + 1);
    FAIL_IF(!runs);
    int set = PyObject_SetAttr(self->rec, s_direct_runs, runs);
    Py_DECREF(runs);
    FAIL_IF(set < 0);

    /* the run: plan.run_stored's bookkeeping, the storages, the kernels */
    FAIL_IF(bump(self->counters, s_flushes, 1) < 0 || bump(self->counters, s_plan_hits, 1) < 0);
    /* plan._touch: the program moves to the back of the plan cap's LRU (by its hash,
       which is Python's to compute) */
    PyObject *seen = KNOWN_GET(self->shapes, self->program, self->program_hash);
    if (seen) {
        Py_INCREF(seen);
        int r = KNOWN_DEL(self->shapes, self->program, self->program_hash) < 0
                || KNOWN_SET(self->shapes, self->program, seen, self->program_hash) < 0;
        Py_DECREF(seen);
        FAIL_IF(r);
    } else FAIL_IF(PyErr_Occurred());
    PyObject *nt = PyObject_GetAttr(self->threads, s_num_threads); /* threads._num_threads, once set */
    FAIL_IF(!nt);
    if (nt == Py_None) {
        Py_DECREF(nt);
        nt = PyObject_CallMethodNoArgs(self->threads, s_get_num_threads);
        FAIL_IF(!nt);
    }
    int64_t nthreads = PyLong_AsLongLong(nt);
    Py_DECREF(nt);
    FAIL_IF(PyErr_Occurred());

    for (Py_ssize_t i = 0; i < self->nexpect; i++)
        if (argst[i] && self->arg_slot[i] >= 0 && !slot[self->arg_slot[i]]) {
            slot[self->arg_slot[i]] = argst[i];
            Py_INCREF(argst[i]);
        }
    for (Py_ssize_t i = 0; i < self->nfresh; i++) {
        PyObject *st = PyObject_Call(self->storage_type, self->fresh_spec[i], NULL);
        FAIL_IF(!st);
        slot[self->fresh_slot[i]] = st;
        PyObject *got = PyObject_Call(self->allocate, self->fresh_alloc[i], NULL); /* (array, address) */
        FAIL_IF(!got);
        PyObject *r = NULL;
        if (PyTuple_Check(got) && PyTuple_GET_SIZE(got) == 2)
            r = PyObject_CallMethodObjArgs(st, s_bind, PyTuple_GET_ITEM(got, 0), PyTuple_GET_ITEM(got, 1), NULL);
        else PyErr_SetString(PyExc_TypeError, "lane: allocate must return (array, address)");
        Py_DECREF(got);
        FAIL_IF(!r);
        Py_DECREF(r);
    }
    Py_ssize_t total = 0, moving = 0;
    for (Py_ssize_t i = 0; i < self->nsteps; i++) total += self->steps[i].nargs, moving += self->steps[i].nmov;
    ptrs = PyMem_Malloc((total + 1) * sizeof(uint64_t));
    /* the arrays the kernels point into, held while they run without the GIL: a thread
       that gives a storage another array meanwhile frees none of them */
    held = PyMem_Calloc(moving + self->nguards + 1, sizeof(PyObject *));
    if (!ptrs || !held) { PyErr_NoMemory(); FAIL_IF(1); }
    for (Py_ssize_t i = 0; i < self->nguards; i++)
        if (self->guards[i].kind == G_WEAK && (held[nheld] = weak_target(self->guards[i].want))) nheld++;
    uint64_t *p = ptrs;
    for (Py_ssize_t i = 0; i < self->nsteps; i++) {
        const Step *s = &self->steps[i];
        memcpy(p, s->fixed, s->nargs * sizeof(uint64_t));
        for (Py_ssize_t j = 0; j < s->nmov; j++) {
            PyObject *st = slot[s->mov_slot[j]];
            if (!st) { PyErr_SetString(PyExc_RuntimeError, "lane: a kernel's storage is missing"); FAIL_IF(1); }
            uint64_t address;
            FAIL_IF(storage_address(st, &address) < 0);
            p[s->mov_at[j]] = address + (uint64_t)s->mov_shift[j];
            FAIL_IF(!(held[nheld] = PyObject_GetAttr(st, s_array)));
            nheld++;
        }
        p += s->nargs;
    }
    FAIL_IF(bump(self->counters, s_kernel_launches, self->launches) < 0
            || bump(self->counters, s_c_calls, self->launches) < 0);
    /* every array a kernel points into is held (above; the sizes and checks by the
       lane's spec): the GIL can go while they run, as a ctypes call lets it go */
    Py_BEGIN_ALLOW_THREADS
    p = ptrs;
    for (Py_ssize_t i = 0; i < self->nsteps; i++) {
        self->steps[i].fn((void **)p, nthreads);
        p += self->steps[i].nargs;
    }
    Py_END_ALLOW_THREADS

    if (self->result_slot >= 0) {
        PyObject *st = slot[self->result_slot];
        if (!st) { PyErr_SetString(PyExc_RuntimeError, "lane: the result's storage is missing"); FAIL_IF(1); }
        out = PyObject_CallFunctionObjArgs(self->tensor_type, st, self->result_layout, NULL);
    } else {
        PyObject *list = PyList_New(nslots);
        FAIL_IF(!list);
        for (Py_ssize_t i = 0; i < nslots; i++) {
            PyObject *st = slot[i] ? slot[i] : Py_None;
            Py_INCREF(st);
            PyList_SET_ITEM(list, i, st);
        }
        out = PyObject_CallFunctionObjArgs(self->rebuild, self->result_spec, list, call, NULL);
        Py_DECREF(list);
    }

done:
    for (Py_ssize_t i = 0; i < nheld; i++) Py_DECREF(held[i]);
    PyMem_Free(held);
    for (Py_ssize_t i = 0; i < nslots; i++) Py_XDECREF(slot[i]);
    for (Py_ssize_t i = 0; i < self->nexpect; i++) Py_XDECREF(argst[i]);
    PyMem_Free(slot);
    PyMem_Free(argst);
    PyMem_Free(ptrs);
    return out;
}

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "braze_lane.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A jit direct replay's guard-and-run (runtime/lane.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lane_init,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_call = (ternaryfunc)lane_call,
};

static struct PyModuleDef lane_module = {PyModuleDef_HEAD_INIT, .m_name = "braze_lane", .m_size = -1};

#define INTERN(var, text) if (!((var) = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit_braze_lane(void) {
    INTERN(s_probe_every, "probe_every");
    INTERN(s_num_threads, "_num_threads");
    INTERN(s_get_num_threads, "get_num_threads");
    INTERN(s_storage, "_storage");
    INTERN(s_layout, "_layout");
    INTERN(s_dtype, "dtype");
    INTERN(s_device, "device");
    INTERN(s_array, "_array");
    INTERN(s_readonly, "readonly");
    INTERN(s_address, "_address");
    INTERN(s_address_fn, "address");
    INTERN(s_bind, "bind");
    INTERN(s_direct_runs, "direct_runs");
    INTERN(s_flushes, "flushes");
    INTERN(s_plan_hits, "plan_hits");
    INTERN(s_kernel_launches, "kernel_launches");
    INTERN(s_c_calls, "c_calls");
    if (PyType_Ready(&LaneType) < 0) return NULL;
    PyObject *m = PyModule_Create(&lane_module);
    if (!m) return NULL;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(m, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
