/*
** replay.c — runs a fuzz target over every file of a corpus directory, as
** an ordinary test (SQLite's fuzzcheck idea): the saved corpus keeps
** guarding the parsers in every build, sanitizers included.
** Prints "N passed, 0 failed" when no input crashes.
*/
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]); return 2; }
  DIR *d = opendir(argv[1]);
  if (!d) { fprintf(stderr, "%s: cannot open\n", argv[1]); return 1; }
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    rewind(f);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    const size_t got = buf ? fread(buf, 1, (size_t)(len > 0 ? len : 0), f) : 0;
    fclose(f);
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    n++;
  }
  closedir(d);
  if (n == 0) { fprintf(stderr, "%s: empty corpus\n", argv[1]); return 1; }
  printf("%zu passed, 0 failed\n", n);
  return 0;
}
