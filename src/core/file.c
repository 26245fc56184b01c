/*
** file.c — opening input files safely.
**
** Every input file is opened with O_NONBLOCK (a FIFO or a device in place
** of a model file must not block the process forever), then checked to be
** a regular file with fstat; only then is the descriptor switched back to
** blocking reads.  A directory, FIFO, socket or device is an error naming
** the path and what it is.
**
** Every output goes through moe8_file_write_atomic: see there.
*/
#define _GNU_SOURCE 1 /* O_CLOEXEC, mkstemp, realpath, strndup */
#define _DEFAULT_SOURCE 1 /* madvise(MADV_HUGEPAGE) */
#include "internal.h"

#include <stdio.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) ? "a character device"
       : S_ISBLK(m) ? "a block device" : "not a regular file";
}

moe8_status moe8__open_regular(const char *path, int *fd_out, size_t *size) {
  *fd_out = -1;
  const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return moe8__fail(MOE8_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    const int e = errno;
    close(fd);
    return moe8__fail(MOE8_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return moe8__fail(MOE8_ERR_IO, "%s: is %s, not a regular file", path, kind(sb.st_mode));
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  *fd_out = fd;
  if (size) *size = (size_t)sb.st_size;
  return MOE8_OK;
}

moe8_status moe8__read_small(const char *path, size_t cap, char **buf, size_t *len) {
  int fd;
  size_t size;
  *buf = NULL;
  moe8_status st = moe8__open_regular(path, &fd, &size);
  if (st != MOE8_OK) return st;
  if (size > cap) { close(fd); return moe8__fail(MOE8_ERR_FORMAT, "%s: %zu bytes, larger than the %zu allowed", path, size, cap); }
  char *b = malloc(size + 1);
  if (!b) { close(fd); return moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory for %zu bytes", path, size); }
  size_t got = 0;
  while (got < size) {
    const ssize_t r = read(fd, b + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int e = errno;
      close(fd);
      free(b);
      return moe8__fail(MOE8_ERR_IO, "%s: read failed at byte %zu: %s", path, got, r == 0 ? "unexpected end of file" : strerror(e));
    }
    got += (size_t)r;
  }
  close(fd);
  b[size] = 0;
  *buf = b;
  *len = size;
  return MOE8_OK;
}

/* ---- writing ------------------------------------------------------------------ */
/* The process's umask without changing it (umask() would, for every
** thread): the "Umask:" line of /proc/self/status, else 022. */
static mode_t current_umask(void) {
  mode_t m = 022;
  char *buf;
  size_t len;
  if (moe8__read_small("/proc/self/status", (size_t)1 << 16, &buf, &len) == MOE8_OK) {
    const char *u = strstr(buf, "\nUmask:");
    if (u) m = (mode_t)strtol(u + 7, NULL, 8) & 0777;
    free(buf);
  }
  moe8_clear_error();
  return m;
}

static moe8_status write_all(int fd, const char *path, const void *const *parts, const size_t *lens, size_t nparts) {
  for (size_t i = 0; i < nparts; i++) {
    const char *p = parts[i];
    size_t left = lens[i];
    while (left) {
      const ssize_t w = write(fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return moe8__fail(MOE8_ERR_IO, "%s: write failed: %s", path, w < 0 ? strerror(errno) : "no progress");
      p += w;
      left -= (size_t)w;
    }
  }
  return MOE8_OK;
}

moe8_status moe8_file_write_atomic(const char *path, const void *const *parts, const size_t *lens, size_t nparts) {
  if (!path || !*path || (nparts && (!parts || !lens))) return moe8__fail(MOE8_ERR_INVALID_ARG, "write: NULL or empty argument");
  /* A symbolic link is followed: the file it names is replaced. */
  char *target = NULL;
  struct stat sb;
  bool exists = false;
  if (lstat(path, &sb) == 0) {
    exists = true;
    if (S_ISLNK(sb.st_mode)) {
      target = realpath(path, NULL);
      if (!target) return moe8__fail(MOE8_ERR_IO, "%s: a symbolic link to a missing file or directory (%s): not written", path, strerror(errno));
      if (stat(target, &sb) != 0) exists = false;
    }
  }
  const char *t = target ? target : path;
  if (exists && S_ISDIR(sb.st_mode)) {
    free(target);
    return moe8__fail(MOE8_ERR_IO, "%s: is a directory, not written", path);
  }
  if (exists && !S_ISREG(sb.st_mode)) {
    /* A device or a FIFO is written in place (e.g. /dev/null, /dev/stdout),
    ** never replaced; a FIFO without a reader, a socket or a block device is refused. */
    moe8_status st = MOE8_OK;
    if (S_ISBLK(sb.st_mode) || S_ISSOCK(sb.st_mode)) st = moe8__fail(MOE8_ERR_IO, "%s: is %s: refused as an output", path, kind(sb.st_mode));
    int fd = -1;
    if (st == MOE8_OK && (fd = open(t, O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK)) < 0)
      st = moe8__fail(MOE8_ERR_IO, "%s: cannot open %s for writing: %s", path, kind(sb.st_mode),
                      errno == ENXIO ? "no process reads the FIFO" : strerror(errno));
    if (st == MOE8_OK) {
      const int fl = fcntl(fd, F_GETFL);
      if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
      st = write_all(fd, path, parts, lens, nparts);
    }
    if (fd >= 0) close(fd);
    free(target);
    return st;
  }
  /* A regular file (or none): a temporary file created exclusively with an
  ** unpredictable name in the same directory, written, flushed to disk,
  ** then renamed over the target; on any failure it is removed and the
  ** target is untouched. */
  const size_t tl = strlen(t);
  const char *slash = strrchr(t, '/');
  const size_t dl = slash ? (size_t)(slash - t) + 1 : 0;
  char *tmp = malloc(tl + 16);
  if (!tmp) { free(target); return moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", path); }
  memcpy(tmp, t, dl);
  snprintf(tmp + dl, tl + 16 - dl, ".%s.XXXXXX", t + dl);
  const int fd = mkstemp(tmp);
  if (fd < 0) {
    moe8_status st = moe8__fail(MOE8_ERR_IO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
    free(tmp); free(target);
    return st;
  }
  /* mkstemp makes 0600: the target's mode when it exists, else 0666 less the umask. */
  (void)fchmod(fd, exists ? (sb.st_mode & 07777) : (0666 & ~current_umask()));
  moe8_status st = write_all(fd, path, parts, lens, nparts);
  if (st == MOE8_OK && fsync(fd) != 0 && errno != EINVAL) st = moe8__fail(MOE8_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
  if (close(fd) != 0 && st == MOE8_OK) st = moe8__fail(MOE8_ERR_IO, "%s: close failed: %s", path, strerror(errno));
  if (st == MOE8_OK && rename(tmp, t) != 0) st = moe8__fail(MOE8_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
  if (st != MOE8_OK) unlink(tmp);
  else {
    /* The rename itself is durable once the directory is flushed. */
    char *dir = strndup(t, dl ? dl : 1);
    const int dfd = dir ? open(dl ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) { (void)fsync(dfd); close(dfd); }
    free(dir);
  }
  free(tmp);
  free(target);
  return st;
}

void moe8__advise_huge(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20, a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + n) & ~(huge - 1);
  if (p && e > a) (void)madvise((void *)a, (size_t)(e - a), MADV_HUGEPAGE); /* refused (a file mapping): no matter */
#else
  (void)p, (void)n;
#endif
}

void *moe8__alloc_weights(size_t n) {
  const size_t huge = (size_t)2 << 20;
  void *p = NULL;
  const size_t big = (n + huge - 1) / huge * huge;
  if (posix_memalign(&p, n >= huge ? huge : 64, n >= huge ? big : n ? n : 64) != 0) return NULL;
  if (n >= huge) moe8__advise_huge(p, big);
  return p;
}
