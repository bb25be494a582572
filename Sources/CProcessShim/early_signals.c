#include "CProcessShim.h"

#include <signal.h>
#include <stddef.h>

static int blocked = 0;

static void block_handled_signals(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    (void)envp;
    sigset_t set;
    sigemptyset(&set);
    // Signals.handled, in Sources/broadcast/Signals.swift.
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGUSR2);
    blocked = sigprocmask(SIG_BLOCK, &set, NULL) == 0;
}

// .preinit_array runs before the initializers of every shared library (FFmpeg's, the Swift
// runtime's), so threads those start inherit the mask too.
__attribute__((section(".preinit_array"), used)) static void (*const block_early)(int, char **, char **) = block_handled_signals;

int CBroadcast_early_signals_blocked(void) { return blocked; }
