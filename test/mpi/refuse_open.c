/* Fault injection for the MPI tests: preloaded (LD_PRELOAD) into one rank of a job, it makes
 * open(), open64(), openat() and access() fail with EACCES for every path that contains the text
 * of HK_TEST_REFUSE_PATHS, as a node whose file system refuses the output would. Everything else
 * goes to the C library. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int refused(const char* path) {
  const char* text = getenv("HK_TEST_REFUSE_PATHS");
  return path != NULL && text != NULL && *text != '\0' && strstr(path, text) != NULL;
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

static int refuse(void) {
  errno = EACCES;
  return -1;
}

/* open() and open64(): the same signature. */
#define HK_PATH_OPEN(name)                                     \
  int name(const char* path, int flags, ...) {                 \
    static int (*real)(const char*, int, ...);                 \
    va_list ap;                                                \
    mode_t mode;                                               \
    va_start(ap, flags);                                       \
    mode = mode_arg(flags, ap);                                \
    va_end(ap);                                                \
    if (refused(path)) return refuse();                        \
    if (real == NULL) *(void**)&real = dlsym(RTLD_NEXT, #name); \
    return real(path, flags, mode);                            \
  }
HK_PATH_OPEN(open)
HK_PATH_OPEN(open64)

int openat(int dir, const char* path, int flags, ...) {
  static int (*real)(int, const char*, int, ...);
  va_list ap;
  mode_t mode;
  va_start(ap, flags);
  mode = mode_arg(flags, ap);
  va_end(ap);
  if (refused(path)) return refuse();
  if (real == NULL) *(void**)&real = dlsym(RTLD_NEXT, "openat");
  return real(dir, path, flags, mode);
}

int access(const char* path, int how) {
  static int (*real)(const char*, int);
  if (refused(path)) return refuse();
  if (real == NULL) *(void**)&real = dlsym(RTLD_NEXT, "access");
  return real(path, how);
}
