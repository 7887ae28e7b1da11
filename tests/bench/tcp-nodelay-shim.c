/*
 * Diagnostic only (see docs/benchmarks.md): an LD_PRELOAD shim that sets TCP_NODELAY on every
 * socket a process accepts, to show what the server's latency tail is without Nagle's algorithm.
 *
 *   cc -shared -fPIC -O2 -o /tmp/tcp-nodelay-shim.so tests/bench/tcp-nodelay-shim.c -ldl
 *   LD_PRELOAD=/tmp/tcp-nodelay-shim.so node ../bench/ydoc-bench.mjs --targets coderoom
 *
 * (The bench's own Node process only connects, so the shim changes nothing there.)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static int nodelay(int fd) {
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

int accept4(int s, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    return nodelay(real(s, addr, len, flags));
}

int accept(int s, struct sockaddr *addr, socklen_t *len) {
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    return nodelay(real(s, addr, len));
}
