// The process's first moments, before Swift's main: what only C can place there.
#pragma once

/// Whether the signals `broadcast` handles were blocked before any library initializer ran (an
/// entry in the executable's .preinit_array): one that arrives before `Signals.install` stays
/// pending until its handler is in place instead of ending the process with the default action
/// (a SIGHUP before `main` ended a daemon with rc 129). `Signals.install` unblocks them once its
/// handlers are installed. What comes before this entry (the dynamic loader mapping and relocating
/// the libraries) no code of the program can cover.
int CBroadcast_early_signals_blocked(void);
