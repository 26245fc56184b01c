/*
** file.c — opening input files safely.
**
** Every input file is opened with O_NONBLOCK (a FIFO or a device in place
** of a model file must not block the process forever), then checked to be
** a regular file with fstat; only then is the descriptor switched back to
** blocking reads.  A directory, FIFO, socket or device is an error naming
** the path and what it is.
*/
#define _GNU_SOURCE 1
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
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
