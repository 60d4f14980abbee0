/* Hostile native code for the confinement tests (tests/native/hostile/test_hostile.py): classic packed
 * functions, each trying one thing a confined worker must not do.  Each returns 0 when it got through
 * (an escape) and -1 with "<what>: <strerror> (errno N)" when it was refused; `benign` does what
 * ordinary native code does (threads, its own workspace, memory within the budget) and must always work. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sched.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../fixtures/tvm_c_abi.h"

void TVMAPISetLastError(const char* msg);
extern char** environ;

#define FN(name)                                                                                  \
  TVM_DLL int32_t name(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret, int32_t* ret_code, \
                       void* resource)
#define UNUSED (void)args; (void)codes; (void)n; (void)ret; (void)ret_code; (void)resource

static int refused(const char* what, int err) {
  static __thread char buf[512];
  snprintf(buf, sizeof buf, "%s: %s (errno %d)", what, strerror(err), err);
  TVMAPISetLastError(buf);
  return -1;
}

FN(h_write_file) { /* (path): create and write it, then remove it */
  UNUSED;
  int fd = open(args[0].v_str, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) return refused("open for writing", errno);
  int ok = write(fd, "x", 1) == 1;
  close(fd);
  unlink(args[0].v_str);
  return ok ? 0 : refused("write", errno);
}

FN(h_overwrite) { /* (path, text): write into an existing file (no create) */
  UNUSED;
  int fd = open(args[0].v_str, O_WRONLY);
  if (fd < 0) return refused("open for writing", errno);
  ssize_t k = write(fd, args[1].v_str, strlen(args[1].v_str));
  int err = errno;
  close(fd);
  return k > 0 ? 0 : refused("write", err);
}

FN(h_read_file) { /* (path): read its first byte */
  UNUSED;
  int fd = open(args[0].v_str, O_RDONLY);
  if (fd < 0) return refused("open for reading", errno);
  char c;
  ssize_t k = read(fd, &c, 1);
  int err = errno;
  close(fd);
  return k == 1 ? 0 : refused("read", err);
}

FN(h_list_dir) { /* (path) */
  UNUSED;
  DIR* d = opendir(args[0].v_str);
  if (!d) return refused("opendir", errno);
  int count = 0;
  while (readdir(d)) ++count;
  closedir(d);
  return count > 2 ? 0 : refused("readdir", EACCES);
}

FN(h_socket) { /* (family, type) */
  UNUSED;
  int fd = socket((int)args[0].v_int64, (int)args[1].v_int64, 0);
  if (fd < 0) return refused("socket", errno);
  close(fd);
  return 0;
}

FN(h_connect_tcp) { /* (port): connect to 127.0.0.1:port */
  UNUSED;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return refused("socket", errno);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)args[0].v_int64)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = connect(fd, (struct sockaddr*)&a, sizeof a);
  int err = errno;
  close(fd);
  return rc == 0 ? 0 : refused("connect", err);
}

FN(h_connect_unix) { /* (path) */
  UNUSED;
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return refused("socket", errno);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strncpy(a.sun_path, args[0].v_str, sizeof a.sun_path - 1);
  int rc = connect(fd, (struct sockaddr*)&a, sizeof a);
  int err = errno;
  close(fd);
  return rc == 0 ? 0 : refused("connect", err);
}

FN(h_fork_exec) { /* fork, and exec a shell in the child */
  UNUSED;
  pid_t pid = fork();
  if (pid < 0) return refused("fork", errno);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", "exit 7", (char*)NULL);
    _exit(100 + errno);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 7) return 0;
  return refused("exec in the child", WIFEXITED(status) ? WEXITSTATUS(status) - 100 : EINTR);
}

FN(h_spawn) { /* posix_spawn a shell (vfork-style clone) */
  UNUSED;
  pid_t pid;
  char* argv[] = {"sh", "-c", "exit 7", NULL};
  int rc = posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ);
  if (rc != 0) return refused("posix_spawn", rc);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 7 ? 0 : refused("spawned shell", ECHILD);
}

FN(h_kill) { /* (pid, sig) */
  UNUSED;
  return kill((pid_t)args[0].v_int64, (int)args[1].v_int64) == 0 ? 0 : refused("kill", errno);
}

FN(h_vm_readv) { /* (pid): read a page of its memory (the first readable mapping when we can see it) */
  UNUSED;
  unsigned long addr = 0x10000;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)args[0].v_int64);
  FILE* f = fopen(path, "r");
  if (f) {
    char line[512], perms[8];
    unsigned long lo, hi;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[0] == 'r') { addr = lo; break; }
    fclose(f);
  }
  char buf[64];
  struct iovec local = {buf, sizeof buf}, remote = {(void*)addr, sizeof buf};
  ssize_t k = syscall(SYS_process_vm_readv, (pid_t)args[0].v_int64, &local, 1, &remote, 1, 0);
  return k > 0 ? 0 : refused("process_vm_readv", errno);
}

FN(h_getenv) { /* (name): a variable of the server's environment */
  UNUSED;
  return getenv(args[0].v_str) ? 0 : refused("getenv", ENOENT);
}

FN(h_is_root) {
  UNUSED;
  if (getuid() == 0 || geteuid() == 0) return 0;
  char what[64];
  snprintf(what, sizeof what, "not root: uid %d", (int)getuid());
  return refused(what, EPERM);
}

FN(h_alloc_touch) { /* (MiB): allocate and touch every page */
  UNUSED;
  size_t size = (size_t)args[0].v_int64 << 20;
  char* p = malloc(size);
  if (!p) return refused("malloc", errno ? errno : ENOMEM);
  for (size_t i = 0; i < size; i += 4096) p[i] = 1;
  free(p);
  return 0;
}

FN(h_ptrace) { /* (pid): attach to it, then let go */
  UNUSED;
  if (ptrace(PTRACE_SEIZE, (pid_t)args[0].v_int64, 0, 0) != 0) return refused("ptrace", errno);
  ptrace(PTRACE_DETACH, (pid_t)args[0].v_int64, 0, 0);
  return 0;
}

FN(h_setuid) { /* (uid) */
  UNUSED;
  return setuid((uid_t)args[0].v_int64) == 0 ? 0 : refused("setuid", errno);
}

FN(h_mount) { /* (dir): mount a tmpfs over it, then unmount it */
  UNUSED;
  if (mount("none", args[0].v_str, "tmpfs", 0, "") != 0) return refused("mount", errno);
  umount2(args[0].v_str, MNT_DETACH);
  return 0;
}

FN(h_chmod) { /* (path, mode) */
  UNUSED;
  return chmod(args[0].v_str, (mode_t)args[1].v_int64) == 0 ? 0 : refused("chmod", errno);
}

FN(h_io_uring) {
  UNUSED;
  char params[120] = {0};
  long fd = syscall(425, 4, params);
  if (fd < 0) return refused("io_uring_setup", errno);
  close((int)fd);
  return 0;
}

FN(h_foreign_abi) { /* x86-64: a system call through the i386 entry (int 0x80): the filter kills */
  UNUSED;
#if defined(__x86_64__)
  long r;
  __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");  /* i386 getpid */
  return r > 0 ? 0 : refused("int 0x80", (int)-r);
#else
  return refused("int 0x80", ENOSYS);
#endif
}

static void* touch(void* p) {
  memset(p, 7, 1 << 20);
  return p;
}

FN(benign) { /* threads, a file in $TMPDIR (the workspace when confined), memory, a signal to itself */
  UNUSED;
  char* mem = malloc(16 << 20);
  if (!mem) return refused("benign malloc", errno);
  pthread_t t[4];
  for (int i = 0; i < 4; ++i)
    if (pthread_create(&t[i], NULL, touch, mem + (i << 20)) != 0) return refused("benign pthread_create", EAGAIN);
  for (int i = 0; i < 4; ++i) pthread_join(t[i], NULL);
  char path[512];
  const char* dir = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/benign-%d", dir ? dir : "/tmp", (int)getpid());
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0) return refused("benign open", errno);
  int ok = write(fd, mem, 4096) == 4096;
  close(fd);
  unlink(path);
  if (!ok) return refused("benign write", errno);
  if (kill(getpid(), 0) != 0) return refused("benign kill(self, 0)", errno);
  int64_t sum = mem[0] + mem[(4 << 20) - 1];
  free(mem);
  ret[0].v_int64 = 40 + sum / 7;
  ret_code[0] = kTVMArgInt;
  return 0;
}

/* Attacks on the channel to the server (guarded on the server's side, confined or not). */
static int socket_fds(int* fds, int max) {
  int k = 0;
  for (int fd = 3; fd < 1024 && k < max; ++fd) {
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) fds[k++] = fd;
  }
  return k;
}

FN(h_forge_answer) { /* (path): send the server a pickle that would run `touch path` in it */
  UNUSED;
  char pickle[600];
  int len = snprintf(pickle, sizeof pickle, "cposix\nsystem\n(Vtouch %s\ntR.", args[0].v_str);
  int fds[8], k = socket_fds(fds, 8);
  if (k == 0) return refused("no socket to the server", ENOENT);
  for (int i = 0; i < k; ++i) {
    uint64_t n = (uint64_t)len;
    if (write(fds[i], &n, 8) != 8 || write(fds[i], pickle, len) != len) return refused("write", errno);
  }
  return 0;
}

FN(h_shrink_arenas) { /* truncate every shared memory file the worker holds (the server maps them) */
  UNUSED;
  int found = 0, shrunk = 0, err = 0;
  for (int fd = 3; fd < 1024; ++fd) {
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, target, sizeof target - 1);
    if (k <= 0) continue;
    target[k] = 0;
    if (strncmp(target, "/memfd:", 7) != 0) continue;
    ++found;
    if (ftruncate(fd, 0) == 0) ++shrunk; else err = errno;
  }
  if (!found) return refused("no shared memory file", ENOENT);
  return shrunk ? 0 : refused("ftruncate", err);
}

FN(h_symlink) { /* (target, link): a symlink in the workspace, where the server works with its own rights */
  UNUSED;
  unlink(args[1].v_str);
  if (symlink(args[0].v_str, args[1].v_str) != 0) return refused("symlink", errno);
  unlink(args[1].v_str);
  return 0;
}

FN(h_prlimit) { /* (pid): set its core-size limit (to what it is: a probe, not a change) */
  UNUSED;
  struct rlimit old;
  if (prlimit((pid_t)args[0].v_int64, RLIMIT_CORE, NULL, &old) != 0) return refused("prlimit (read)", errno);
  return prlimit((pid_t)args[0].v_int64, RLIMIT_CORE, &old, NULL) == 0 ? 0 : refused("prlimit", errno);
}

FN(h_setaffinity) { /* (pid): set its CPUs (to what they are) */
  UNUSED;
  cpu_set_t set;
  if (sched_getaffinity((pid_t)args[0].v_int64, sizeof set, &set) != 0) return refused("sched_getaffinity", errno);
  return sched_setaffinity((pid_t)args[0].v_int64, sizeof set, &set) == 0 ? 0 : refused("sched_setaffinity", errno);
}

FN(h_setown) { /* (pid): make pid the owner of a descriptor: it would receive the descriptor's SIGIO */
  UNUSED;
  int p[2];
  if (pipe(p) != 0) return refused("pipe", errno);
  int rc = fcntl(p[0], F_SETOWN, (int)args[0].v_int64);
  int err = errno;
  close(p[0]);
  close(p[1]);
  return rc == 0 ? 0 : refused("fcntl F_SETOWN", err);
}

/* (pid): on every socket the worker holds (the client's too, once the server lent it the connection):
 * blocking, a 30 s linger, asynchronous I/O signalled to pid.  Always "succeeds": the server must not care. */
FN(h_grab_sockets) {
  UNUSED;
  int fds[16], k = socket_fds(fds, 16);
  for (int i = 0; i < k; ++i) {
    int fl = fcntl(fds[i], F_GETFL);
    if (fl >= 0) fcntl(fds[i], F_SETFL, (fl & ~O_NONBLOCK) | O_ASYNC);
    struct linger lg = {1, 30};
    setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    fcntl(fds[i], F_SETOWN, (int)args[0].v_int64);
  }
  return 0;
}
