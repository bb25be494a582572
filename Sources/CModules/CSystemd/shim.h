#pragma once
// sd-bus (libsystemd): the D-Bus client for the xdg-desktop-portal ScreenCast API.
#include <systemd/sd-bus.h>
