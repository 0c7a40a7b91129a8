/*
 * signals.c — the stop flag behind SIGTERM, SIGINT and SIGUSR1 (see signals.h).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include "util/common.h"
#include "util/signals.h"

static volatile sig_atomic_t stop_sig = 0;
static int installed = 0;
static struct sigaction old_term, old_int, old_usr1;

/* Append a decimal number to buf (async-signal-safe). */
static size_t put_int(char *buf, size_t off, int v) {
    char tmp[16];
    int n = 0;
    if (v < 0) { buf[off++] = '-'; v = -v; }
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v && n < 15);
    while (n) buf[off++] = tmp[--n];
    return off;
}

/* First signal: remember it. A second SIGTERM/SIGINT: say so and end this rank now. */
static void on_signal(int sig) {
    if (stop_sig && sig != SIGUSR1) {
        char msg[160];
        size_t off = 0;
        const char *a = "pipelm: rank ", *b = ": error: second stop signal (", *c = "): ending now without a checkpoint\n";
        memcpy(msg + off, a, strlen(a)); off += strlen(a);
        off = put_int(msg, off, pl_rank);
        memcpy(msg + off, b, strlen(b)); off += strlen(b);
        const char *name = signals_name(sig);
        memcpy(msg + off, name, strlen(name)); off += strlen(name);
        memcpy(msg + off, c, strlen(c)); off += strlen(c);
        ssize_t w = write(2, msg, off);
        (void)w;
        _exit(128 + sig);
    }
    if (!stop_sig) stop_sig = sig;
}

void signals_install(void) {
    if (installed) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGUSR1, &sa, &old_usr1);
    installed = 1;
}

void signals_restore(void) {
    if (!installed) return;
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    installed = 0;
    stop_sig = 0;
}

int signals_stop_pending(void) { return (int)stop_sig; }

const char *signals_name(int sig) {
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
    }
}
