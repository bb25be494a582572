/* Paints CLOCK_MONOTONIC as a barcode on an X display, many times a second, for the glass-to-glass
 * latency benchmark (benchmarks/glass.py reads it back from the decoded stream).
 *
 *   painter WIDTH HEIGHT RATE      (DISPLAY from the environment)
 *
 * A window covering the screen: a band of BITS Manchester-coded bit pairs (bit, not bit) in
 * bars BAR pixels wide and BAND_H high at the top, the rest grey. The value is the clock in units of
 * 100 µs, modulo 2^BITS. Each paint is one fill of the black bars and one of the white ones, then a
 * round trip (the server has drawn it before the next paint); a capture that falls between the two
 * fills shows a pair (black, black) and is rejected by the reader, never read as a wrong time. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <xcb/xcb.h>

enum { BITS = 32, BAR = 16, BAND_H = 96 };

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: painter WIDTH HEIGHT RATE\n");
        return 2;
    }
    int width = atoi(argv[1]), height = atoi(argv[2]);
    double rate = atof(argv[3]);
    if (width < 2 * BITS * BAR || height < BAND_H || rate <= 0) {
        fprintf(stderr, "painter: bad size or rate\n");
        return 2;
    }
    xcb_connection_t *c = xcb_connect(NULL, NULL);
    if (xcb_connection_has_error(c)) {
        fprintf(stderr, "painter: cannot open the display\n");
        return 1;
    }
    xcb_screen_t *screen = xcb_setup_roots_iterator(xcb_get_setup(c)).data;
    xcb_window_t win = xcb_generate_id(c);
    uint32_t values[2] = {0x808080, 1};
    xcb_create_window(c, XCB_COPY_FROM_PARENT, win, screen->root, 0, 0, width, height, 0,
                      XCB_WINDOW_CLASS_INPUT_OUTPUT, screen->root_visual,
                      XCB_CW_BACK_PIXEL | XCB_CW_OVERRIDE_REDIRECT, values);
    xcb_map_window(c, win);
    xcb_gcontext_t black = xcb_generate_id(c), white = xcb_generate_id(c);
    uint32_t b = 0x000000, w = 0xffffff;
    xcb_create_gc(c, black, win, XCB_GC_FOREGROUND, &b);
    xcb_create_gc(c, white, win, XCB_GC_FOREGROUND, &w);
    xcb_flush(c);
    free(xcb_get_input_focus_reply(c, xcb_get_input_focus(c), NULL));

    uint64_t period = (uint64_t)(1e9 / rate);
    uint64_t next = now_ns();
    int x0 = (width - 2 * BITS * BAR) / 2;
    for (;;) {
        uint64_t t = now_ns();
        uint32_t value = (uint32_t)(t / 100000);
        xcb_rectangle_t blacks[BITS], whites[BITS];
        for (int i = 0; i < BITS; i++) {
            int bit = (value >> (BITS - 1 - i)) & 1;
            /* pair i: bars 2i and 2i+1; bit 1 = (black, white), bit 0 = (white, black) */
            int16_t xb = (int16_t)(x0 + (2 * i + (bit ? 0 : 1)) * BAR);
            int16_t xw = (int16_t)(x0 + (2 * i + (bit ? 1 : 0)) * BAR);
            blacks[i] = (xcb_rectangle_t){xb, 0, BAR, BAND_H};
            whites[i] = (xcb_rectangle_t){xw, 0, BAR, BAND_H};
        }
        xcb_poly_fill_rectangle(c, win, black, BITS, blacks);
        xcb_poly_fill_rectangle(c, win, white, BITS, whites);
        xcb_get_input_focus_reply_t *r = xcb_get_input_focus_reply(c, xcb_get_input_focus(c), NULL);
        if (!r) return 1;
        free(r);
        next += period;
        uint64_t after = now_ns();
        if (next < after) next = after;
        struct timespec ts = {(time_t)(next / 1000000000ull), (long)(next % 1000000000ull)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
}
