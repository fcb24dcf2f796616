/*
 * Preload library of redlock-testkit's fake clocks (`ClusterBuilder::fake_clock`).
 *
 * Shifts the realtime clock of the process it is preloaded into (LD_PRELOAD) by an offset the
 * test process can change at any time, as an NTP step would: `gettimeofday`, `time`,
 * `timespec_get` and `clock_gettime` of CLOCK_REALTIME, CLOCK_REALTIME_COARSE and CLOCK_TAI
 * are shifted; CLOCK_MONOTONIC, CLOCK_BOOTTIME and every other clock are not, and neither are
 * sleeps and timeouts.
 *
 * The offset lives in the file named by $REDLOCK_TESTKIT_CLOCK_FILE, 16 bytes in native byte
 * order: a u64 sequence number, odd while the test process is writing, then the offset as i64
 * nanoseconds. The file is mapped shared on the first clock read, so a new offset is seen by
 * the next read, at the cost of two memory loads. No file, a short file or an unset variable
 * mean an offset of zero.
 *
 * Why not libfaketime: Debian's redis-server uses jemalloc, whose initialisation reads
 * CLOCK_MONOTONIC while holding its init lock; libfaketime, not yet initialised at that point,
 * initialises itself there, its dlsym() of a symbol glibc no longer exports allocates an error
 * message, and jemalloc deadlocks on its own lock. So this library never allocates, never
 * calls dlsym() and reads the real clocks with the raw system call.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_SEC 1000000000LL
/* Bound on retries while the test process is writing; it writes 8 bytes at a time. */
#define MAX_RETRIES 100000

struct shift {
    uint64_t seq;
    int64_t offset_ns;
};

static struct shift *mapped;

static const struct shift *shift_file(void) {
    struct shift *m = __atomic_load_n(&mapped, __ATOMIC_ACQUIRE);
    if (m) {
        return m;
    }
    const char *path = getenv("REDLOCK_TESTKIT_CLOCK_FILE");
    if (!path) {
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return NULL;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(struct shift)) {
        p = mmap(NULL, sizeof(struct shift), PROT_READ, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (p == MAP_FAILED) {
        return NULL;
    }
    struct shift *expected = NULL;
    if (!__atomic_compare_exchange_n(&mapped, &expected, (struct shift *)p, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        /* Another thread mapped it first. */
        munmap(p, sizeof(struct shift));
        return expected;
    }
    return p;
}

static int64_t offset_ns(void) {
    const struct shift *s = shift_file();
    if (!s) {
        return 0;
    }
    int64_t offset = 0;
    for (int i = 0; i < MAX_RETRIES; i++) {
        uint64_t before = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
        offset = __atomic_load_n(&s->offset_ns, __ATOMIC_ACQUIRE);
        uint64_t after = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
        if (before == after && (before & 1) == 0) {
            break;
        }
    }
    return offset;
}

static void shift(struct timespec *ts) {
    int64_t offset = offset_ns();
    if (offset == 0) {
        return;
    }
    int64_t nsec = (int64_t)ts->tv_nsec + offset % NS_PER_SEC;
    int64_t sec = (int64_t)ts->tv_sec + offset / NS_PER_SEC;
    if (nsec < 0) {
        nsec += NS_PER_SEC;
        sec -= 1;
    } else if (nsec >= NS_PER_SEC) {
        nsec -= NS_PER_SEC;
        sec += 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)nsec;
}

static int real_clock_gettime(clockid_t clock, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

static int is_realtime(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int res = real_clock_gettime(clock, ts);
    if (res == 0 && is_realtime(clock)) {
        shift(ts);
    }
    return res;
}

/* glibc declares `tv` non-null, but a null `tv` must not crash here either. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wnonnull-compare"
#endif
int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    if (real_clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return -1;
    }
    shift(&ts);
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    if (tz) {
        /* As glibc does: the timezone argument is obsolete and reported as UTC. */
        struct timezone *zone = tz;
        zone->tz_minuteswest = 0;
        zone->tz_dsttime = 0;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (real_clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    shift(&ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base) {
    if (base != TIME_UTC || real_clock_gettime(CLOCK_REALTIME, ts) != 0) {
        return 0;
    }
    shift(ts);
    return base;
}
