/*
 * aiodiskqueue._writer: the write lane, a native writer thread that never takes the GIL.
 *
 * Why a native thread: docs/design.md, "Why wake-ups decide the design" (a hand-off
 * to a Python I/O thread pays two cross-CPU wake-ups). This thread takes batches of payloads from a small ring, writes them
 * as records with pwritev() (headers framed here, no copy of the payloads), then
 * fdatasync()s them when asked, and spins for a short, adaptive while before
 * it sleeps, so a busy queue hands it the next batch without waking anybody. It
 * tells the event loop through an eventfd, written at most once per batch of
 * completions. The Python side (aiodiskqueue._core.lane) decides what goes here: only
 * appends inside the current segment; everything else stays on the Python I/O
 * thread, and the two never run at the same time.
 *
 * The same thread also reads ahead for the consumer (submit_read): a pread into a
 * bytes buffer, again without the GIL, so a consumer busy in Python never holds up
 * the next read (a Python thread needs the GIL to start and to finish each read,
 * and waits up to the interpreter's switch interval for it each time). The module's
 * split_records() is the C implementation of the record codec's parse().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RING 16
/* The writer thread's name (at most 15 characters), exported as THREAD_NAME. */
#define WRITER_THREAD_NAME "adq-writer"
#define SPIN_MIN_NS 10000LL
/* The most bytes a record job publishes after its records (a role record). */
#define PUB_MAX 128

typedef struct {
    int fd;
    int sync;
    int read;            /* a read job: pread `total` bytes at `offset` into `rview` */
    char *swap;          /* owned: a meta store (swap_file): directory, spare, name, data */
    const char *swap_spare, *swap_name, *swap_data;
    Py_buffer rview;     /* a read job: the caller's writable buffer, held until reaped */
    long long offset;
    long long total;     /* bytes to write */
    struct iovec *iov;   /* owned: a header and a payload per record */
    int iovcnt;
    char *hdr;           /* owned record headers */
    PyObject *keep;      /* a tuple holding the payloads */
    long long written;
    int write_errno;
    int sync_errno;
    int pub_fd;          /* a record job: then pwrite `pub` at offset 0 of this fd; -1: no */
    int pub_len;
    char pub[PUB_MAX];
} job_t;

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_t ring[RING];
    _Atomic unsigned long long submitted;
    _Atomic unsigned long long completed;
    unsigned long long reaped; /* touched by the event loop only */
    _Atomic int sleeping;
    _Atomic int signaled;
    _Atomic int stop;
    int claimed;         /* poll() took `signaled`: no eventfd write to read (loop only) */
    int efd;
    int started;
    long long spin_max_ns;
    /* No spin after a write larger than this (put_many's batches): its producer is
     * building the next one for far longer than a spin lasts. Given by the engine. */
    long long small_max;
    long long spin_ns; /* touched by the writer thread only */
} Writer;

static long long
now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Wait until a job is submitted past `done` or stop is set. Spins first, for a
 * window that adapts like the kernel's haltpoll governor: it doubles when work came
 * soon after the worker went idle and halves when it did not. Not after a job that
 * ended with an fdatasync, wrote a large batch or read ahead (`synced`): the next batch
 * of a queue that syncs every write comes only once the loop has woken its producers
 * and gathered their puts, that of put_many once its producer has built it, and the
 * next read once the consumer has taken half the read-ahead, all later than a spin is
 * worth, so the thread sleeps at once (and the window is kept). */
static void
wait_for_work(Writer *w, unsigned long long done, int synced)
{
    long long t0 = now_ns();
    long long spin = synced ? 0 : w->spin_ns;
    while (spin > 0 && atomic_load(&w->submitted) == done && !atomic_load(&w->stop)) {
        if (now_ns() - t0 >= spin)
            break;
        cpu_relax();
    }
    if (atomic_load(&w->submitted) == done && !atomic_load(&w->stop)) {
        pthread_mutex_lock(&w->mu);
        atomic_store(&w->sleeping, 1);
        while (atomic_load(&w->submitted) == done && !atomic_load(&w->stop))
            pthread_cond_wait(&w->cv, &w->mu);
        atomic_store(&w->sleeping, 0);
        pthread_mutex_unlock(&w->mu);
    }
    if (w->spin_max_ns <= 0 || synced)
        return;
    if (now_ns() - t0 <= w->spin_max_ns) {
        long long grown = w->spin_ns < SPIN_MIN_NS ? SPIN_MIN_NS : w->spin_ns * 2;
        w->spin_ns = grown > w->spin_max_ns ? w->spin_max_ns : grown;
    } else {
        w->spin_ns /= 2;
    }
}

/*
 * swap_file: the common case of aiodiskqueue._format.meta.store_meta in one call that
 * releases the GIL once. A Python thread takes the GIL back after every system call, and
 * while a consumer on the event loop takes ready messages without a break it waits up
 * to the interpreter's switch interval (5 ms) for it each time: a sync round of the I/O
 * thread took 4.5 ms at the median for about 1 ms of system calls. The steps, under
 * `directory`: write `data` into the existing file `spare` and cut it to that size,
 * fsync it, swap it with `name` (renameat2 RENAME_EXCHANGE) and fsync the directory.
 * Returns 0, or the errno of the step that failed (ENOSYS where the kernel cannot
 * swap): the caller then takes the portable steps, which redo all of it.
 */
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

static int
fsync_retry(int fd)
{
    while (fsync(fd) < 0) {
        if (errno != EINTR)
            return errno;
    }
    return 0;
}

static int
swap_file_nogil(const char *directory, const char *spare, const char *name,
                const char *data, Py_ssize_t len)
{
    int err = 0;
    int dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno;
    int fd = openat(dfd, spare, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
        goto out;
    }
    Py_ssize_t n = 0;
    while (n < len) {
        ssize_t r = pwrite(fd, data + n, (size_t)(len - n), (off_t)n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            err = errno;
            break;
        }
        if (r == 0) {
            err = EIO;
            break;
        }
        n += r;
    }
    if (!err && ftruncate(fd, (off_t)len) < 0)
        err = errno;
    if (!err)
        err = fsync_retry(fd);
    close(fd);
    if (err)
        goto out;
#ifdef SYS_renameat2
    if (syscall(SYS_renameat2, dfd, spare, dfd, name, RENAME_EXCHANGE) < 0) {
        err = errno;
        goto out;
    }
#else
    err = ENOSYS;
    goto out;
#endif
    err = fsync_retry(dfd);
out:
    close(dfd);
    return err;
}

/* A read job: pread into the caller's buffer (exported to this job, so it cannot be
 * resized, and looked at by the caller only once the job is reaped). Stops early at
 * the end of the file: `written` is then the bytes read. */
static void
run_read(job_t *j)
{
    char *dst = j->rview.buf;
    long long n = 0;
    j->write_errno = 0;
    j->sync_errno = 0;
    while (n < j->total) {
        ssize_t r = pread(j->fd, dst + n, (size_t)(j->total - n), (off_t)(j->offset + n));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            j->write_errno = errno;
            break;
        }
        if (r == 0)
            break;
        n += r;
    }
    j->written = n;
}

static void
run_job(job_t *j)
{
    if (j->read) {
        run_read(j);
        return;
    }
    if (j->swap) {
        j->written = 0;
        j->write_errno = 0;
        j->sync_errno = swap_file_nogil(j->swap, j->swap_spare, j->swap_name, j->swap_data,
                                        (Py_ssize_t)j->total);
        return;
    }
    struct iovec *iov = j->iov;
    int cnt = j->iovcnt;
    long long n = 0;
    j->write_errno = 0;
    j->sync_errno = 0;
    while (n < j->total) {
        ssize_t r = pwritev(j->fd, iov, cnt > IOV_MAX ? IOV_MAX : cnt, (off_t)(j->offset + n));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            j->write_errno = errno;
            break;
        }
        if (r == 0) {
            j->write_errno = EIO;
            break;
        }
        n += r;
        size_t left = (size_t)r; /* skip what was written; resume inside a cut iovec */
        while (cnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (left) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    j->written = n;
    if (!j->write_errno && j->sync) {
        while (fdatasync(j->fd) < 0) {
            if (errno != EINTR) {
                j->sync_errno = errno;
                break;
            }
        }
    }
    /* Publish: only records written (and fdatasynced, if asked) whole. A failure shows
     * as a write errno with every record written (`written` == `total`). */
    if (j->pub_fd >= 0 && !j->write_errno && !j->sync_errno) {
        for (;;) {
            ssize_t r = pwrite(j->pub_fd, j->pub, (size_t)j->pub_len, 0);
            if (r == (ssize_t)j->pub_len)
                break;
            if (r < 0 && errno == EINTR)
                continue;
            j->write_errno = r < 0 ? errno : EIO;
            break;
        }
    }
}

static void
job_release(job_t *j)
{
    if (j->read) {
        PyBuffer_Release(&j->rview);
        j->read = 0;
    }
    Py_CLEAR(j->keep);
    PyMem_RawFree(j->swap);
    j->swap = NULL;
    PyMem_RawFree(j->iov);
    j->iov = NULL;
    PyMem_RawFree(j->hdr);
    j->hdr = NULL;
}

static void *
worker_main(void *arg)
{
    Writer *w = arg;
    unsigned long long done = 0;
    int synced = 0;
    for (;;) {
        if (atomic_load(&w->submitted) == done) {
            if (atomic_load(&w->stop))
                return NULL;
            wait_for_work(w, done, synced);
            continue;
        }
        job_t *j = &w->ring[done % RING];
        run_job(j);
        /* read before the job is published: the loop may reap it */
        synced = j->sync || j->read || j->swap || j->total > w->small_max;
        done++;
        atomic_store(&w->completed, done);
        if (!atomic_exchange(&w->signaled, 1)) {
            unsigned long long one = 1;
            ssize_t r;
            do {
                r = write(w->efd, &one, sizeof one);
            } while (r < 0 && errno == EINTR);
        }
    }
}

static int
Writer_init(Writer *w, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"spin_us", "small_max", NULL};
    long spin_us;
    long long small_max;
    if (w->started) {
        PyErr_SetString(PyExc_RuntimeError, "Writer already started");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "lL", kwlist, &spin_us, &small_max))
        return -1;
    if (spin_us < 0 || small_max < 0) {
        PyErr_SetString(PyExc_ValueError, "spin_us and small_max must be >= 0");
        return -1;
    }
    w->small_max = small_max;
    w->spin_max_ns = (long long)spin_us * 1000;
    w->spin_ns = w->spin_max_ns;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc) {
        close(w->efd);
        w->efd = -1;
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
#if defined(__linux__) && defined(_GNU_SOURCE)
    /* Named here, before the constructor returns, for top -H, ps -L and the per-thread
     * CPU in /proc (bench/bench_put_threads.py); a name is only a label, so not fatal. */
    (void)pthread_setname_np(w->thread, WRITER_THREAD_NAME);
#endif
    w->started = 1;
    return 0;
}

static job_t *
next_slot(Writer *w)
{
    if (!w->started) {
        PyErr_SetString(PyExc_RuntimeError, "writer is closed");
        return NULL;
    }
    unsigned long long s = atomic_load(&w->submitted);
    if (s - w->reaped >= RING) {
        PyErr_SetString(PyExc_RuntimeError, "writer ring is full");
        return NULL;
    }
    return &w->ring[s % RING];
}

static void
publish(Writer *w)
{
    atomic_fetch_add(&w->submitted, 1);
    if (atomic_load(&w->sleeping)) {
        pthread_mutex_lock(&w->mu);
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
}

/* Frame `seq` (bytes payloads) into job `j`: a header and a payload iovec per record.
 * Returns 0, or -1 with an exception set (nothing owned by `j` then). */
static int
frame_job(job_t *j, PyObject *seq)
{
    PyObject *items = PySequence_Tuple(seq); /* the payloads stay alive and unchanged */
    if (items == NULL)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (n == 0 || n > INT_MAX / 2) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_ValueError, "a batch needs 1 to INT_MAX/2 payloads");
        return -1;
    }
    char *hdr = PyMem_RawMalloc((size_t)n * 4);
    struct iovec *iov = PyMem_RawMalloc((size_t)n * 2 * sizeof(struct iovec));
    if (hdr == NULL || iov == NULL) {
        PyMem_RawFree(hdr);
        PyMem_RawFree(iov);
        Py_DECREF(items);
        PyErr_NoMemory();
        return -1;
    }
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyTuple_GET_ITEM(items, i);
        if (!PyBytes_CheckExact(p) || PyBytes_GET_SIZE(p) > INT32_MAX) {
            PyMem_RawFree(hdr);
            PyMem_RawFree(iov);
            Py_DECREF(items);
            PyErr_SetString(PyExc_TypeError, "payloads must be bytes of at most 2**31-1 bytes");
            return -1;
        }
        uint32_t len = (uint32_t)PyBytes_GET_SIZE(p);
        unsigned char *h = (unsigned char *)hdr + 4 * i;
        h[0] = (unsigned char)(len >> 24);
        h[1] = (unsigned char)(len >> 16);
        h[2] = (unsigned char)(len >> 8);
        h[3] = (unsigned char)len;
        iov[2 * i].iov_base = h;
        iov[2 * i].iov_len = 4;
        iov[2 * i + 1].iov_base = PyBytes_AS_STRING(p);
        iov[2 * i + 1].iov_len = len;
        total += 4 + (long long)len;
    }
    j->keep = items;
    j->read = 0;
    j->swap = NULL;
    j->pub_fd = -1;
    j->hdr = hdr;
    j->iov = iov;
    j->iovcnt = (int)(2 * n);
    j->total = total;
    return 0;
}

/* Check a record job's publish arguments: 0, or -1 with an exception set. */
static int
check_pub(int pub_fd, Py_ssize_t pub_len)
{
    if (pub_fd >= 0 && (pub_len <= 0 || pub_len > PUB_MAX)) {
        PyErr_Format(PyExc_ValueError, "a published record needs 1 to %d bytes, got %zd",
                     PUB_MAX, pub_len);
        return -1;
    }
    return 0;
}

/* Queue `seq` as records at `offset` of `fd` for the writer thread, then (`pub_fd` >= 0)
 * `pub` at offset 0 of `pub_fd`: the bytes to write, or -1 with an exception set
 * (nothing queued then). */
static long long
submit_job(Writer *w, int fd, PyObject *seq, long long offset, int sync, int pub_fd,
           const char *pub, Py_ssize_t pub_len)
{
    if (check_pub(pub_fd, pub_len) < 0)
        return -1;
    job_t *j = next_slot(w);
    if (j == NULL)
        return -1;
    if (frame_job(j, seq) < 0)
        return -1;
    if (pub_fd >= 0) {
        memcpy(j->pub, pub, (size_t)pub_len);
        j->pub_len = (int)pub_len;
        j->pub_fd = pub_fd;
    }
    j->fd = fd;
    j->offset = offset;
    j->sync = sync;
    long long total = j->total;
    publish(w);
    return total;
}

static PyObject *
Writer_submit_records(Writer *w, PyObject *args)
{
    int fd, sync, pub_fd = -1;
    PyObject *seq;
    long long offset;
    const char *pub = NULL;
    Py_ssize_t pub_len = 0;
    if (!PyArg_ParseTuple(args, "iOLp|iy#", &fd, &seq, &offset, &sync, &pub_fd, &pub,
                          &pub_len))
        return NULL;
    long long total = submit_job(w, fd, seq, offset, sync, pub_fd, pub, pub_len);
    if (total < 0)
        return NULL;
    return PyLong_FromLongLong(total);
}

/* Queue a read of `nbytes` at `offset` of `fd` into the writable buffer `buf` (a
 * bytearray the caller reuses: no allocation, no page faults per read). The caller
 * must not look at it until the job is reaped. */
static PyObject *
Writer_submit_read(Writer *w, PyObject *args)
{
    int fd;
    Py_buffer view;
    long long offset, nbytes;
    if (!PyArg_ParseTuple(args, "iw*LL", &fd, &view, &offset, &nbytes))
        return NULL;
    if (nbytes <= 0 || nbytes > view.len || offset < 0) {
        PyErr_Format(PyExc_ValueError, "a read needs 0 < nbytes <= %zd and offset >= 0, "
                     "got %lld at %lld", view.len, nbytes, offset);
        PyBuffer_Release(&view);
        return NULL;
    }
    job_t *j = next_slot(w);
    if (j == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    j->rview = view;
    j->read = 1;
    j->swap = NULL;
    j->keep = NULL;
    j->iov = NULL;
    j->hdr = NULL;
    j->iovcnt = 0;
    j->fd = fd;
    j->offset = offset;
    j->total = nbytes;
    j->sync = 0;
    publish(w);
    Py_RETURN_NONE;
}

/* Queue a meta store (swap_file's steps) behind the jobs submitted before: the sync
 * round of a consumer, off the GIL. Its result's third item is swap_file's errno. */
static PyObject *
Writer_submit_swap(Writer *w, PyObject *args)
{
    const char *directory, *spare, *name;
    Py_ssize_t ld, ls, ln, len;
    const char *data;
    if (!PyArg_ParseTuple(args, "y#y#y#y#", &directory, &ld, &spare, &ls, &name, &ln,
                          &data, &len))
        return NULL;
    if (strlen(directory) != (size_t)ld || strlen(spare) != (size_t)ls
            || strlen(name) != (size_t)ln) {
        PyErr_SetString(PyExc_ValueError, "embedded null byte");
        return NULL;
    }
    job_t *j = next_slot(w);
    if (j == NULL)
        return NULL;
    char *mem = PyMem_RawMalloc((size_t)(ld + ls + ln + len + 3));
    if (mem == NULL)
        return PyErr_NoMemory();
    memcpy(mem, directory, (size_t)ld + 1);
    memcpy(mem + ld + 1, spare, (size_t)ls + 1);
    memcpy(mem + ld + ls + 2, name, (size_t)ln + 1);
    memcpy(mem + ld + ls + ln + 3, data, (size_t)len);
    j->swap = mem;
    j->swap_spare = mem + ld + 1;
    j->swap_name = mem + ld + ls + 2;
    j->swap_data = mem + ld + ls + ln + 3;
    j->read = 0;
    j->keep = NULL;
    j->iov = NULL;
    j->hdr = NULL;
    j->iovcnt = 0;
    j->fd = -1;
    j->offset = 0;
    j->total = len;
    j->sync = 0;
    publish(w);
    Py_RETURN_NONE;
}

/* Write a batch now, on the calling thread (the event loop), without the GIL while
 * pwritev runs. Only while no job is queued: the caller keeps the order of writes. */
static PyObject *
Writer_write_records(Writer *w, PyObject *args)
{
    int fd;
    PyObject *seq;
    long long offset;
    if (!PyArg_ParseTuple(args, "iOL", &fd, &seq, &offset))
        return NULL;
    if (!w->started) {
        PyErr_SetString(PyExc_RuntimeError, "writer is closed");
        return NULL;
    }
    if (atomic_load(&w->submitted) != w->reaped) {
        PyErr_SetString(PyExc_RuntimeError, "writer has jobs queued");
        return NULL;
    }
    job_t j;
    memset(&j, 0, sizeof j);
    if (frame_job(&j, seq) < 0)
        return NULL;
    j.fd = fd;
    j.offset = offset;
    j.sync = 0;
    Py_BEGIN_ALLOW_THREADS
    run_job(&j);
    Py_END_ALLOW_THREADS
    long long written = j.written;
    int err = j.write_errno;
    job_release(&j);
    return Py_BuildValue("(Lii)", written, err, 0);
}

/* Wait on the calling thread (the event loop), the GIL released, for up to
 * `timeout_ns` until job number `want` is done: 1 if it is (reap() now gives it), 0 if
 * not by then. While it waits it holds
 * `signaled`, so the writer thread skips the eventfd write for what it finishes: the
 * loop neither sleeps in epoll nor is woken for a job it collects itself. On a
 * timeout it gives `signaled` back and looks once more, so a job finished meanwhile is
 * either seen here or signalled through the eventfd. The writer publishes `completed`
 * before it looks at `signaled`, so a poll that sees a job done in between (the writer
 * preempted there) lets an eventfd write through that carries no job: reap() then gives
 * nothing, and the loop only pays a wake-up. */
static int
wait_done(Writer *w, unsigned long long want, long long timeout_ns)
{
    if (atomic_load(&w->completed) >= want)
        return 1;
    int claimed = !atomic_exchange(&w->signaled, 1);
    int done = 0;
    Py_BEGIN_ALLOW_THREADS
    long long t0 = now_ns();
    for (;;) {
        if (atomic_load(&w->completed) >= want) {
            done = 1;
            break;
        }
        if (now_ns() - t0 >= timeout_ns)
            break;
        cpu_relax();
    }
    Py_END_ALLOW_THREADS
    if (claimed) {
        if (done) {
            w->claimed = 1; /* reap() clears `signaled`; the eventfd was not written */
        } else {
            atomic_store(&w->signaled, 0);
            done = atomic_load(&w->completed) >= want;
            if (done && atomic_exchange(&w->signaled, 1) == 0)
                w->claimed = 1;
        }
    }
    return done;
}

/* poll(timeout_ns): wait_done() for the oldest job not yet reaped; -1 if none is. */
static PyObject *
Writer_poll(Writer *w, PyObject *arg)
{
    long long timeout_ns = PyLong_AsLongLong(arg);
    if (timeout_ns == -1 && PyErr_Occurred())
        return NULL;
    if (atomic_load(&w->submitted) == w->reaped)
        return PyLong_FromLong(-1);
    return PyLong_FromLong(wait_done(w, w->reaped + 1, timeout_ns));
}

/* Before reaping: consume the eventfd's signal unless a poll claimed it (then the writer
 * did not write it), and let the writer signal the next completion again. */
static void
take_signal(Writer *w)
{
    unsigned long long buf;
    if (w->efd >= 0 && !w->claimed) {
        ssize_t r = read(w->efd, &buf, sizeof buf); /* nonblocking: EAGAIN when not signaled */
        (void)r;
    }
    w->claimed = 0;
    atomic_store(&w->signaled, 0);
}

/* submit_records() and poll() in one call, for a batch the loop waits for while nothing
 * else is queued: the job's (written, write errno, 0) if it was done within
 * `timeout_ns` (reaped here), else None (it stays in flight: reap() gives it, signalled
 * through the eventfd as any job). A timeout of 0 or less does not wait at all. */
static PyObject *
Writer_write_polled(Writer *w, PyObject *args)
{
    int fd, pub_fd = -1;
    PyObject *seq;
    long long offset, timeout_ns;
    const char *pub = NULL;
    Py_ssize_t pub_len = 0;
    if (!PyArg_ParseTuple(args, "iOLL|iy#", &fd, &seq, &offset, &timeout_ns, &pub_fd, &pub,
                          &pub_len))
        return NULL;
    if (w->started && atomic_load(&w->submitted) != w->reaped) {
        PyErr_SetString(PyExc_RuntimeError, "writer has jobs queued");
        return NULL;
    }
    if (submit_job(w, fd, seq, offset, 0, pub_fd, pub, pub_len) < 0)
        return NULL;
    if (timeout_ns <= 0 || !wait_done(w, w->reaped + 1, timeout_ns))
        Py_RETURN_NONE;
    /* Only this job was queued, and it is done: reap it (released and counted even if
     * its result cannot be built, so the ring stays in step with the caller's futures). */
    take_signal(w);
    job_t *j = &w->ring[w->reaped % RING];
    PyObject *res = Py_BuildValue("(Lii)", j->written, j->write_errno, j->sync_errno);
    job_release(j);
    w->reaped++;
    return res;
}

static PyObject *
Writer_reap(Writer *w, PyObject *Py_UNUSED(ignored))
{
    take_signal(w);
    unsigned long long c = atomic_load(&w->completed);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    while (w->reaped < c) {
        job_t *j = &w->ring[w->reaped % RING];
        PyObject *t = Py_BuildValue("(Lii)", j->written, j->write_errno, j->sync_errno);
        if (t == NULL || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(t);
        job_release(j);
        w->reaped++;
    }
    return out;
}

static PyObject *
Writer_fileno(Writer *w, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(w->efd);
}

static PyObject *
Writer_inflight(Writer *w, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromUnsignedLongLong(atomic_load(&w->submitted) - w->reaped);
}

static void
writer_stop(Writer *w)
{
    if (w->started) {
        atomic_store(&w->stop, 1);
        pthread_mutex_lock(&w->mu);
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(w->thread, NULL);
        Py_END_ALLOW_THREADS
        w->started = 0;
        while (w->reaped < atomic_load(&w->submitted)) {
            job_release(&w->ring[w->reaped % RING]);
            w->reaped++;
        }
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    if (w->efd >= 0) {
        close(w->efd);
        w->efd = -1;
    }
}

static PyObject *
Writer_close(Writer *w, PyObject *Py_UNUSED(ignored))
{
    writer_stop(w);
    Py_RETURN_NONE;
}

static PyObject *
Writer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)args;
    (void)kwds;
    Writer *w = (Writer *)type->tp_alloc(type, 0);
    if (w != NULL)
        w->efd = -1;
    return (PyObject *)w;
}

static void
Writer_dealloc(Writer *w)
{
    writer_stop(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef Writer_methods[] = {
    {"submit_records", (PyCFunction)Writer_submit_records, METH_VARARGS,
     "submit_records(fd, payloads, offset, sync[, pub_fd, pub]) -> bytes to write: queue\n"
     "the records (4-byte big-endian length + payload each) as pwritev calls, no copy;\n"
     "then, if they were written (and fdatasynced) whole, pwrite pub at offset 0 of pub_fd."},
    {"submit_read", (PyCFunction)Writer_submit_read, METH_VARARGS,
     "submit_read(fd, buf, offset, nbytes) -> None: queue a pread of nbytes at offset into\n"
     "the writable buffer buf, filled once the job is reaped (reap() gives the bytes read)."},
    {"write_records", (PyCFunction)Writer_write_records, METH_VARARGS,
     "write_records(fd, payloads, offset) -> (written, write_errno, 0): write the records\n"
     "now on the calling thread (GIL released), while no job is queued."},
    {"submit_swap", (PyCFunction)Writer_submit_swap, METH_VARARGS,
     "submit_swap(directory, spare, name, data): queue swap_file's steps; the job's\n"
     "result is (0, 0, errno or 0)."},
    {"reap", (PyCFunction)Writer_reap, METH_NOARGS,
     "reap() -> list of (written, write_errno, sync_errno) for the jobs done, in order."},
    {"write_polled", (PyCFunction)Writer_write_polled, METH_VARARGS,
     "write_polled(fd, payloads, offset, timeout_ns[, pub_fd, pub]) -> (written,\n"
     "write_errno, 0) or None:\n"
     "submit_records() and poll() in one call, while no job is queued; None if the job\n"
     "is still in flight after timeout_ns (reap() gives it later)."},
    {"poll", (PyCFunction)Writer_poll, METH_O,
     "poll(timeout_ns) -> 1 if the oldest job in flight is done (waiting up to timeout_ns,\n"
     "GIL released, for it), 0 if not, -1 if none is in flight."},
    {"fileno", (PyCFunction)Writer_fileno, METH_NOARGS,
     "fileno() -> the eventfd that becomes readable when jobs are done."},
    {"inflight", (PyCFunction)Writer_inflight, METH_NOARGS,
     "inflight() -> jobs submitted and not yet reaped."},
    {"close", (PyCFunction)Writer_close, METH_NOARGS,
     "close() -> None: finish the submitted jobs, stop the thread, close the eventfd."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aiodiskqueue._core._writer.Writer",
    .tp_doc = "Writer(spin_us, small_max): a native thread that appends framed "
               "batches to files; it spins for the next job only after a write of at most "
               "small_max bytes.",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Writer_new,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_methods = Writer_methods,
};

/*
 * Multi-phase initialisation (PEP 489). The module has no state of its own
 * (m_size 0); Writer is a static type, shared by every interpreter that imports
 * the module under the one GIL, so a per-interpreter GIL is not declared.
 * Py_mod_gil: the writer thread never touches a Python object (it runs without
 * the GIL by design), and the methods keep no global state, so a free-threaded
 * build need not re-enable the GIL for this module. As with the rest of the
 * queue, one Writer is driven by one event loop thread at a time.
 */
/*
 * split_records: the fast implementation of aiodiskqueue._format.codec.parse (the
 * codec owns the rule; tests check that both agree on any buffer). Records are a
 * 4-byte big-endian signed length N and N payload bytes. Stops at the first record
 * that does not fit in the buffer, at a length outside [min_size, max_size] (returned
 * as bad_length), or after max_records records when that is not negative. With
 * positions false the list holds the payloads alone (the records lie back to back from
 * base to stop, so their positions follow from the lengths).
 */
static PyObject *
split_records(PyObject *mod, PyObject *args)
{
    Py_buffer view;
    long long base, file_num, min_size, max_size;
    Py_ssize_t max_records = -1;
    int positions = 1;
    (void)mod;
    if (!PyArg_ParseTuple(args, "y*LLLL|np", &view, &base, &file_num, &min_size, &max_size,
                          &max_records, &positions))
        return NULL;
    if (min_size < 0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "min_size must be >= 0, got %lld", min_size);
        return NULL;
    }
    const unsigned char *p = view.buf;
    Py_ssize_t len = view.len, off = 0, left = max_records;
    PyObject *records = PyList_New(0), *fnum = PyLong_FromLongLong(file_num);
    PyObject *bad = NULL;
    if (records == NULL || fnum == NULL)
        goto error;
    while (off + 4 <= len && left != 0) {
        int32_t n = (int32_t)(((uint32_t)p[off] << 24) | ((uint32_t)p[off + 1] << 16)
                              | ((uint32_t)p[off + 2] << 8) | (uint32_t)p[off + 3]);
        if (n < min_size || n > max_size) {
            bad = PyLong_FromLong(n);
            if (bad == NULL)
                goto error;
            break;
        }
        if (off + 4 + (Py_ssize_t)n > len)
            break;
        PyObject *payload = PyBytes_FromStringAndSize((const char *)p + off + 4, n);
        if (payload == NULL)
            goto error;
        off += 4 + (Py_ssize_t)n;
        if (!positions) {
            int rc = PyList_Append(records, payload);
            Py_DECREF(payload);
            if (rc < 0)
                goto error;
            left--;
            continue;
        }
        PyObject *end = PyLong_FromLongLong(base + off);
        if (end == NULL) {
            Py_DECREF(payload);
            goto error;
        }
        Py_INCREF(fnum);
        PyObject *rec = PyTuple_New(3);
        if (rec == NULL) {
            Py_DECREF(payload);
            Py_DECREF(end);
            Py_DECREF(fnum);
            goto error;
        }
        PyTuple_SET_ITEM(rec, 0, payload);
        PyTuple_SET_ITEM(rec, 1, fnum);
        PyTuple_SET_ITEM(rec, 2, end);
        int rc = PyList_Append(records, rec);
        Py_DECREF(rec);
        if (rc < 0)
            goto error;
        left--;
    }
    PyBuffer_Release(&view);
    Py_DECREF(fnum);
    if (bad == NULL) {
        bad = Py_None;
        Py_INCREF(bad);
    }
    return Py_BuildValue("(NLN)", records, base + (long long)off, bad);
error:
    PyBuffer_Release(&view);
    Py_XDECREF(records);
    Py_XDECREF(fnum);
    Py_XDECREF(bad);
    return NULL;
}

static PyObject *
swap_file(PyObject *mod, PyObject *args)
{
    const char *directory, *spare, *name;
    Py_buffer data;
    (void)mod;
    if (!PyArg_ParseTuple(args, "yyyy*", &directory, &spare, &name, &data))
        return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = swap_file_nogil(directory, spare, name, data.buf, data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromLong(err);
}

static PyMethodDef module_methods[] = {
    {"split_records", split_records, METH_VARARGS,
     "split_records(buf, base, file_num, min_size, max_size, max_records=-1,\n"
     "positions=True) -> (records, stop, bad_length): codec.parse in C; records are\n"
     "(payload, file_num, end_offset), or payloads alone with positions false; stop\n"
     "the file offset where parsing stopped, bad_length the out-of-range length found\n"
     "there, else None."},
    {"swap_file", swap_file, METH_VARARGS,
     "swap_file(directory, spare, name, data) -> errno or 0: write data into the existing\n"
     "file spare, fsync it, swap it with name (RENAME_EXCHANGE), fsync the directory;\n"
     "the GIL is released once for all of it. Names are bytes, spare and name relative\n"
     "to directory."},
    {NULL, NULL, 0, NULL},
};

static int
writer_exec(PyObject *m)
{
    if (PyType_Ready(&WriterType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "RING", RING) < 0)
        return -1;
    if (PyModule_AddStringConstant(m, "THREAD_NAME", WRITER_THREAD_NAME) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot writer_slots[] = {
    {Py_mod_exec, writer_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef writer_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aiodiskqueue._core._writer",
    .m_doc = "The native write lane of aiodiskqueue.",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = writer_slots,
};

PyMODINIT_FUNC
PyInit__writer(void)
{
    return PyModuleDef_Init(&writer_module);
}
