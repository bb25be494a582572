#include "CWebRTCShim.h"

#define GST_USE_UNSTABLE_API
#include <gst/gst.h>
#include <gst/app/gstappsrc.h>
#include <gst/rtp/rtp.h>
#include <gst/sdp/sdp.h>
#include <gst/webrtc/webrtc.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct CBroadcastWHIPPeer {
    GstElement *pipeline;
    GstElement *webrtc;
    GstElement *video;
    GstElement *audio;
    /// Each branch's sdes:mid header extension (on its payloader), told its mid after the offer.
    GstRTPHeaderExtension *video_mid;
    GstRTPHeaderExtension *audio_mid;
    GstBus *bus;
    /// Written by GStreamer's threads, read by the owner.
    atomic_uint_fast64_t keyframe_requests;
    atomic_uint_fast64_t rtcp_received;
    atomic_uint_fast64_t byes;
    /// Owner only: running time minus encoder time (ns), once the first buffer came.
    int has_base;
    int64_t base;
    char pipeline_error[256];
    /// The DTLS certificate and its key (PEM), ECDSA P-256: g_free'd with the peer.
    gchar *certificate;
    /// DTLS decoders given the certificate (by webrtcbin's thread).
    atomic_int certificates_given;
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static void init_libraries(void) {
    gst_init(NULL, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void set_error(char *error, size_t size, const char *text) {
    if (error && size > 0) snprintf(error, size, "%s", text);
}

/// A self-signed ECDSA P-256 certificate and its private key, PEM, for DTLS (g_free), or NULL.
/// webrtcbin's own is RSA, which a DTLS client offering only ECDSA suites (aiortc's, in the
/// setup:active answer that is its default) cannot complete a handshake with; browsers use
/// ECDSA P-256 too.
static gchar *make_certificate(void) {
    gchar *pem = NULL;
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *certificate = X509_new();
    BIO *out = BIO_new(BIO_s_mem());
    if (key && certificate && out) {
        X509_set_version(certificate, 2);
        ASN1_INTEGER_set_int64(X509_get_serialNumber(certificate), (int64_t)g_random_int() << 16 | g_random_int_range(1, 1 << 16));
        X509_gmtime_adj(X509_getm_notBefore(certificate), -24 * 3600);
        X509_gmtime_adj(X509_getm_notAfter(certificate), 30L * 24 * 3600);
        X509_NAME *name = X509_get_subject_name(certificate);
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"broadcast", -1, -1, 0);
        X509_set_issuer_name(certificate, name);
        char *data = NULL;
        long size = 0;
        if (X509_set_pubkey(certificate, key) == 1 && X509_sign(certificate, key, EVP_sha256()) > 0
            && PEM_write_bio_X509(out, certificate) == 1 && PEM_write_bio_PrivateKey(out, key, NULL, NULL, 0, NULL, NULL) == 1
            && (size = BIO_get_mem_data(out, &data)) > 0) {
            pem = g_strndup(data, (gsize)size);
        }
    }
    if (out) BIO_free(out);
    if (certificate) X509_free(certificate);
    if (key) EVP_PKEY_free(key);
    return pem;
}

/// Gives every DTLS decoder in `element` (itself, or inside it when a bin) the peer's certificate.
/// webrtcbin makes a transport's bins during its offer and adds them to itself before it brings
/// them up: dtlssrtpdec makes its DTLS connection (with its certificate) when given one, and
/// dtlssrtpenc takes that connection when it comes up. Given later, the decoder would already
/// listen to its first connection and refuse the peer's certificate.
static void give_certificate(CBroadcastWHIPPeer *peer, GstElement *element) {
    GstElementFactory *factory = gst_element_get_factory(element);
    if (factory && strcmp(GST_OBJECT_NAME(factory), "dtlssrtpdec") == 0) {
        if (!g_object_get_data(G_OBJECT(element), "broadcast-certificate")) {
            g_object_set(element, "pem", peer->certificate, NULL);
            g_object_set_data(G_OBJECT(element), "broadcast-certificate", GINT_TO_POINTER(1));
            atomic_fetch_add(&peer->certificates_given, 1);
        }
        return;
    }
    if (!GST_IS_BIN(element)) return;
    GstIterator *children = gst_bin_iterate_recurse(GST_BIN(element));
    GValue item = G_VALUE_INIT;
    gboolean done = FALSE;
    while (!done) {
        switch (gst_iterator_next(children, &item)) {
        case GST_ITERATOR_OK:
            give_certificate(peer, GST_ELEMENT(g_value_get_object(&item)));
            g_value_reset(&item);
            break;
        case GST_ITERATOR_RESYNC:
            gst_iterator_resync(children);
            break;
        default:
            done = TRUE;
        }
    }
    g_value_unset(&item);
    gst_iterator_free(children);
}

/// Runs on webrtcbin's thread, inside its gst_bin_add.
static void on_deep_element_added(GstBin *bin, GstBin *sub_bin, GstElement *element, gpointer data) {
    (void)bin; (void)sub_bin;
    give_certificate(data, element);
}

/// Every a=fingerprint of `sdp` replaced by `fingerprint`; how many there were.
static int name_certificate(GstSDPMessage *sdp, const gchar *fingerprint) {
    int named = 0;
    for (guint i = 0; i < gst_sdp_message_medias_len(sdp); i++) {
        GstSDPMedia *media = (GstSDPMedia *)gst_sdp_message_get_media(sdp, i);
        for (guint a = 0; a < gst_sdp_media_attributes_len(media); a++) {
            const GstSDPAttribute *attribute = gst_sdp_media_get_attribute(media, a);
            if (g_strcmp0(attribute->key, "fingerprint") != 0) continue;
            GstSDPAttribute replacement;
            gst_sdp_attribute_set(&replacement, "fingerprint", fingerprint);
            gst_sdp_media_replace_attribute(media, a, &replacement);
            named++;
        }
    }
    for (guint a = 0; a < gst_sdp_message_attributes_len(sdp); a++) {
        const GstSDPAttribute *attribute = gst_sdp_message_get_attribute(sdp, a);
        if (g_strcmp0(attribute->key, "fingerprint") != 0) continue;
        GstSDPAttribute replacement;
        gst_sdp_attribute_set(&replacement, "fingerprint", fingerprint);
        gst_sdp_message_replace_attribute(sdp, a, &replacement);
        named++;
    }
    return named;
}

/// "sha-256 AB:CD:..." of the peer's certificate, as SDP's a=fingerprint names it (g_free).
static gchar *certificate_fingerprint(const gchar *pem) {
    BIO *in = BIO_new_mem_buf(pem, -1);
    X509 *certificate = in ? PEM_read_bio_X509(in, NULL, NULL, NULL) : NULL;
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    gchar *text = NULL;
    if (certificate && X509_digest(certificate, EVP_sha256(), digest, &size) == 1) {
        GString *out = g_string_new("sha-256 ");
        for (unsigned int i = 0; i < size; i++) g_string_append_printf(out, i ? ":%02X" : "%02X", digest[i]);
        text = g_string_free(out, FALSE);
    }
    if (certificate) X509_free(certificate);
    if (in) BIO_free(in);
    return text;
}

static GstPadProbeReturn on_upstream_event(GstPad *pad, GstPadProbeInfo *info, gpointer data) {
    (void)pad;
    CBroadcastWHIPPeer *peer = data;
    GstEvent *event = GST_PAD_PROBE_INFO_EVENT(info);
    if (event && GST_EVENT_TYPE(event) == GST_EVENT_CUSTOM_UPSTREAM && gst_event_has_name(event, "GstForceKeyUnit")) {
        atomic_fetch_add(&peer->keyframe_requests, 1);
    }
    return GST_PAD_PROBE_OK;
}

static void on_ssrc_active(GstElement *rtpbin, guint session, guint ssrc, gpointer data) {
    (void)rtpbin; (void)session; (void)ssrc;
    CBroadcastWHIPPeer *peer = data;
    atomic_fetch_add(&peer->rtcp_received, 1);
}

static void on_bye(GstElement *rtpbin, guint session, guint ssrc, gpointer data) {
    (void)rtpbin; (void)session; (void)ssrc;
    CBroadcastWHIPPeer *peer = data;
    atomic_fetch_add(&peer->byes, 1);
}

#define MID_EXTENSION_URI GST_RTP_HDREXT_BASE "sdes:mid"
#define MID_EXTENSION_ID 1

/// A new element of `factory` held by the caller (its floating reference sunk), or NULL: every
/// way out of add_branch drops it, and a bin it was added to keeps its own.
static GstElement *make_owned(const char *factory) {
    GstElement *element = gst_element_factory_make(factory, NULL);
    return element ? GST_ELEMENT(gst_object_ref_sink(element)) : NULL;
}

/// appsrc → payloader → capsfilter → webrtcbin's sink_%u, its transceiver send-only with `caps`.
/// The offer is made before any buffer has given the payloader caps, so webrtcbin knows only what
/// the caps here say: they fix the branch's SSRC (a random one, which the payloader takes from its
/// peer's caps), so the offer announces it (a=ssrc), and offer the mid header extension (a=extmap),
/// which the payloader writes on every packet (`mid`). SFUs map RTP to a stream by one or the other
/// (Janus drops every packet of an SSRC it was not told of).
static int add_branch(CBroadcastWHIPPeer *peer, GstElement **source, GstRTPHeaderExtension **mid,
    const char *source_caps, const char *payloader, const char *rtp_caps, char *error, size_t error_size) {
    int result = -1;
    int h264 = strcmp(payloader, "rtph264pay") == 0;
    GstElement *src = make_owned("appsrc");
    GstElement *pay = make_owned(payloader);
    GstElement *filter = make_owned("capsfilter");
    // H.264: h264parse puts the SPS's profile and level in the caps, which the payloader's caps
    // (the offer's profile-level-id) must match.
    GstElement *parse = h264 ? make_owned("h264parse") : NULL;
    GstCaps *rtp = NULL;
    GstPad *sink = NULL;
    if (h264 && !parse) {
        set_error(error, error_size, "GStreamer element h264parse not found: install gstreamer1.0-plugins-bad");
        goto done;
    }
    if (!src || !pay || !filter) {
        char text[200];
        snprintf(text, sizeof text, "GStreamer element %s not found: install gstreamer1.0-plugins-base and -good",
            !src ? "appsrc" : !pay ? payloader : "capsfilter");
        set_error(error, error_size, text);
        goto done;
    }
    GstCaps *caps = gst_caps_from_string(source_caps);
    g_object_set(src, "caps", caps, "is-live", TRUE, "format", GST_FORMAT_TIME, "do-timestamp", FALSE,
        "max-bytes", (guint64)0, "max-buffers", (guint64)256, "block", FALSE, NULL);
    gst_util_set_object_arg(G_OBJECT(src), "leaky-type", "downstream");
    gst_caps_unref(caps);
    if (h264) {
        // SPS/PPS before every IDR (a viewer that joins or asked with PLI can decode it), one
        // packet per NAL unit as soon as it is there.
        g_object_set(pay, "config-interval", -1, "pt", 96, "mtu", 1200, NULL);
        gst_util_set_object_arg(G_OBJECT(pay), "aggregate-mode", "zero-latency");
    } else {
        g_object_set(pay, "pt", 111, "mtu", 1200, NULL);
    }
    guint32 ssrc = g_random_int();
    if (ssrc == 0) ssrc = 1;
    rtp = gst_caps_from_string(rtp_caps);
    gst_caps_set_simple(rtp, "ssrc", G_TYPE_UINT, ssrc, "extmap-" G_STRINGIFY(MID_EXTENSION_ID), G_TYPE_STRING,
        MID_EXTENSION_URI, NULL);
    g_object_set(filter, "caps", rtp, NULL);
    *mid = gst_rtp_header_extension_create_from_uri(MID_EXTENSION_URI);
    if (*mid) {
        gst_rtp_header_extension_set_id(*mid, MID_EXTENSION_ID);
        g_signal_emit_by_name(pay, "add-extension", *mid);
    }
    // The pipeline takes its own references (freed with it from here on, whatever happens).
    gst_bin_add_many(GST_BIN(peer->pipeline), src, pay, filter, NULL);
    if (parse) gst_bin_add(GST_BIN(peer->pipeline), parse);
    if (parse ? !gst_element_link_many(src, parse, pay, filter, NULL) : !gst_element_link_many(src, pay, filter, NULL)) {
        set_error(error, error_size, "could not link appsrc to the RTP payloader");
        goto done;
    }
    sink = gst_element_request_pad_simple(peer->webrtc, "sink_%u");
    GstPad *out = gst_element_get_static_pad(filter, "src");
    int linked = sink && out && gst_pad_link(out, sink) == GST_PAD_LINK_OK;
    if (out) gst_object_unref(out);
    if (!linked) {
        if (sink) gst_element_release_request_pad(peer->webrtc, sink);
        set_error(error, error_size, "could not link the RTP payloader to webrtcbin");
        goto done;
    }
    GstWebRTCRTPTransceiver *transceiver = NULL;
    g_object_get(sink, "transceiver", &transceiver, NULL);
    if (transceiver) {
        g_object_set(transceiver, "direction", GST_WEBRTC_RTP_TRANSCEIVER_DIRECTION_SENDONLY, "codec-preferences", rtp, NULL);
        gst_object_unref(transceiver);
    }
    *source = src;
    result = 0;
done:
    if (sink) gst_object_unref(sink);
    if (rtp) gst_caps_unref(rtp);
    if (parse) gst_object_unref(parse);
    if (filter) gst_object_unref(filter);
    if (pay) gst_object_unref(pay);
    if (src) gst_object_unref(src);
    return result;
}

CBroadcastWHIPPeer *CBroadcastWHIP_new(const char *profile_level_id, int audio_channels, const char *stun,
    const char *const *turns, size_t turn_count, char *error, size_t error_size) {
    pthread_once(&init_once, init_libraries);
    CBroadcastWHIPPeer *peer = calloc(1, sizeof *peer);
    if (!peer) {
        set_error(error, error_size, "out of memory");
        return NULL;
    }
    atomic_init(&peer->keyframe_requests, 0);
    atomic_init(&peer->rtcp_received, 0);
    atomic_init(&peer->byes, 0);
    atomic_init(&peer->certificates_given, 0);
    peer->certificate = make_certificate();
    if (!peer->certificate) {
        set_error(error, error_size, "could not make the DTLS certificate (ECDSA P-256, OpenSSL)");
        free(peer);
        return NULL;
    }
    // webrtcbin makes an rtpbin inside it and, without one, goes on with NULL (criticals, then a
    // crash at the offer): asked first.
    GstElementFactory *rtpbin_factory = gst_element_factory_find("rtpbin");
    if (!rtpbin_factory) {
        set_error(error, error_size, "GStreamer's rtpbin not found (webrtcbin sends RTP through it): install gstreamer1.0-plugins-good");
        g_free(peer->certificate);
        free(peer);
        return NULL;
    }
    gst_object_unref(rtpbin_factory);
    peer->pipeline = gst_pipeline_new(NULL);
    g_signal_connect(peer->pipeline, "deep-element-added", G_CALLBACK(on_deep_element_added), peer);
    peer->webrtc = gst_element_factory_make("webrtcbin", NULL);
    if (!peer->webrtc) {
        set_error(error, error_size, "GStreamer's webrtcbin not found: install gstreamer1.0-plugins-bad and gstreamer1.0-nice");
        gst_object_unref(peer->pipeline);
        g_free(peer->certificate);
        free(peer);
        return NULL;
    }
    gst_util_set_object_arg(G_OBJECT(peer->webrtc), "bundle-policy", "max-bundle");
    if (stun && *stun) g_object_set(peer->webrtc, "stun-server", stun, NULL);
    for (size_t i = 0; i < turn_count; i++) {
        gboolean added = FALSE;
        g_signal_emit_by_name(peer->webrtc, "add-turn-server", turns[i], &added);
    }
    gst_bin_add(GST_BIN(peer->pipeline), peer->webrtc);
    // The endpoint's RTCP is what tells a live session from a dead one: without rtpbin's signals
    // every session would end after --timeout and reconnect forever. Found by what it is, not by
    // webrtcbin's internal name for it.
    GstElement *rtpbin = NULL;
    GstIterator *found = gst_bin_iterate_all_by_element_factory_name(GST_BIN(peer->webrtc), "rtpbin");
    GValue item = G_VALUE_INIT;
    if (found && gst_iterator_next(found, &item) == GST_ITERATOR_OK) {
        rtpbin = GST_ELEMENT(g_value_dup_object(&item));
        g_value_unset(&item);
    }
    if (found) gst_iterator_free(found);
    if (!rtpbin) {
        set_error(error, error_size, "webrtcbin has no rtpbin: the endpoint's RTCP could not be counted");
        CBroadcastWHIP_free(peer);
        return NULL;
    }
    g_signal_connect(rtpbin, "on-ssrc-active", G_CALLBACK(on_ssrc_active), peer);
    g_signal_connect(rtpbin, "on-bye-ssrc", G_CALLBACK(on_bye), peer);
    gst_object_unref(rtpbin);
    if (profile_level_id) {
        char caps[512];
        snprintf(caps, sizeof caps,
            "application/x-rtp,media=video,encoding-name=H264,payload=96,clock-rate=90000,"
            "packetization-mode=(string)1,profile-level-id=(string)%s,level-asymmetry-allowed=(string)1,"
            "rtcp-fb-nack-pli=(boolean)true,rtcp-fb-ccm-fir=(boolean)true",
            profile_level_id);
        if (add_branch(peer, &peer->video, &peer->video_mid, "video/x-h264,stream-format=byte-stream,alignment=au",
                "rtph264pay", caps, error, error_size) != 0) {
            CBroadcastWHIP_free(peer);
            return NULL;
        }
        GstPad *pad = gst_element_get_static_pad(peer->video, "src");
        gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_EVENT_UPSTREAM, on_upstream_event, peer, NULL);
        gst_object_unref(pad);
    }
    if (audio_channels > 0) {
        char source[200];
        snprintf(source, sizeof source, "audio/x-opus,channel-mapping-family=(int)0,channels=(int)%d,rate=(int)48000",
            audio_channels);
        if (add_branch(peer, &peer->audio, &peer->audio_mid, source, "rtpopuspay",
                "application/x-rtp,media=audio,encoding-name=OPUS,payload=111,clock-rate=48000,encoding-params=(string)2",
                error, error_size) != 0) {
            CBroadcastWHIP_free(peer);
            return NULL;
        }
    }
    peer->bus = gst_element_get_bus(peer->pipeline);
    if (gst_element_set_state(peer->pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE) {
        set_error(error, error_size, "the WebRTC pipeline did not start");
        CBroadcastWHIP_free(peer);
        return NULL;
    }
    return peer;
}

void CBroadcastWHIP_free(CBroadcastWHIPPeer *peer) {
    if (!peer) return;
    if (peer->pipeline) {
        gst_element_set_state(peer->pipeline, GST_STATE_NULL);
        gst_object_unref(peer->pipeline);
    }
    if (peer->bus) gst_object_unref(peer->bus);
    if (peer->video_mid) gst_object_unref(peer->video_mid);
    if (peer->audio_mid) gst_object_unref(peer->audio_mid);
    g_free(peer->certificate);
    free(peer);
}

/// Emits `signal` with `argument` and a promise, waits for it; the reply (may be NULL) is the
/// caller's to read before the promise is unreffed.
static GstPromise *call(GstElement *webrtc, const char *signal, gpointer argument) {
    GstPromise *promise = gst_promise_new();
    g_signal_emit_by_name(webrtc, signal, argument, promise);
    gst_promise_wait(promise);
    return promise;
}

static int reply_error(GstPromise *promise, char *error, size_t error_size, const char *what) {
    const GstStructure *reply = gst_promise_get_reply(promise);
    if (reply && gst_structure_has_field(reply, "error")) {
        GError *e = NULL;
        gst_structure_get(reply, "error", G_TYPE_ERROR, &e, NULL);
        char text[256];
        snprintf(text, sizeof text, "%s: %s", what, e ? e->message : "failed");
        set_error(error, error_size, text);
        if (e) g_error_free(e);
        return -1;
    }
    return 0;
}

/// The mid header extension of the branch that sends `media` (an m-line), if any.
static GstRTPHeaderExtension *branch_mid(CBroadcastWHIPPeer *peer, const GstSDPMedia *media) {
    const char *kind = gst_sdp_media_get_media(media);
    return g_strcmp0(kind, "video") == 0 ? peer->video_mid : g_strcmp0(kind, "audio") == 0 ? peer->audio_mid : NULL;
}

char *CBroadcastWHIP_offer(CBroadcastWHIPPeer *peer, int64_t timeout_ms, CBroadcastAbandonCheck abandon,
    void *abandon_context, char *error, size_t error_size) {
    GstPromise *promise = call(peer->webrtc, "create-offer", NULL);
    if (reply_error(promise, error, error_size, "creating the offer") != 0) {
        gst_promise_unref(promise);
        return NULL;
    }
    GstWebRTCSessionDescription *offer = NULL;
    const GstStructure *reply = gst_promise_get_reply(promise);
    if (reply) gst_structure_get(reply, "offer", GST_TYPE_WEBRTC_SESSION_DESCRIPTION, &offer, NULL);
    gst_promise_unref(promise);
    if (!offer) {
        set_error(error, error_size, "webrtcbin made no offer");
        return NULL;
    }
    // The mid each m-line got is what the payloaders' mid header extension writes.
    for (guint i = 0; i < gst_sdp_message_medias_len(offer->sdp); i++) {
        const GstSDPMedia *media = gst_sdp_message_get_media(offer->sdp, i);
        GstRTPHeaderExtension *extension = branch_mid(peer, media);
        const char *mid = gst_sdp_media_get_attribute_val(media, "mid");
        if (extension && mid) g_object_set(extension, "mid", mid, NULL);
    }
    // The offer made the transports, which took the ECDSA certificate (on_deep_element_added);
    // the fingerprint webrtcbin wrote is its own certificate's: the offer names ours (another
    // fingerprint has the endpoint drop the handshake once it completed: no media, no error here).
    gchar *fingerprint = certificate_fingerprint(peer->certificate);
    int given = atomic_load(&peer->certificates_given);
    int named = fingerprint ? name_certificate(offer->sdp, fingerprint) : 0;
    g_free(fingerprint);
    if (given == 0 || named == 0) {
        gst_webrtc_session_description_free(offer);
        set_error(error, error_size, given == 0 ? "webrtcbin made no DTLS transport to give the certificate to"
                                                : "webrtcbin's offer names no DTLS fingerprint");
        return NULL;
    }
    promise = call(peer->webrtc, "set-local-description", offer);
    gst_webrtc_session_description_free(offer);
    int failed = reply_error(promise, error, error_size, "setting the local description");
    gst_promise_unref(promise);
    if (failed) return NULL;
    // Every candidate in the offer: WHIP's POST carries them (trickle is optional).
    gint64 deadline = g_get_monotonic_time() + timeout_ms * 1000;
    for (;;) {
        GstWebRTCICEGatheringState state = GST_WEBRTC_ICE_GATHERING_STATE_NEW;
        g_object_get(peer->webrtc, "ice-gathering-state", &state, NULL);
        if (state == GST_WEBRTC_ICE_GATHERING_STATE_COMPLETE) break;
        if (g_get_monotonic_time() > deadline) {
            set_error(error, error_size, "ICE gathering did not complete in time");
            return NULL;
        }
        if (abandon && abandon(abandon_context)) {
            set_error(error, error_size, "ICE gathering abandoned: the output is stopping");
            return NULL;
        }
        g_usleep(10000);
    }
    GstWebRTCSessionDescription *local = NULL;
    g_object_get(peer->webrtc, "local-description", &local, NULL);
    if (!local) {
        set_error(error, error_size, "webrtcbin has no local description");
        return NULL;
    }
    gchar *text = gst_sdp_message_as_text(local->sdp);
    gst_webrtc_session_description_free(local);
    return text;
}

int CBroadcastWHIP_answer(CBroadcastWHIPPeer *peer, const char *sdp, char *error, size_t error_size) {
    GstSDPMessage *message = NULL;
    if (gst_sdp_message_new_from_text(sdp, &message) != GST_SDP_OK || !message) {
        set_error(error, error_size, "the answer is not SDP");
        return -1;
    }
    if (gst_sdp_message_medias_len(message) == 0) {
        gst_sdp_message_free(message);
        set_error(error, error_size, "the answer has no media");
        return -1;
    }
    // An m-line whose answer did not take the mid header extension gets packets without it.
    for (guint i = 0; i < gst_sdp_message_medias_len(message); i++) {
        const GstSDPMedia *media = gst_sdp_message_get_media(message, i);
        GstRTPHeaderExtension *extension = branch_mid(peer, media);
        int taken = 0;
        for (guint j = 0; extension && j < gst_sdp_media_attributes_len(media); j++) {
            const GstSDPAttribute *attribute = gst_sdp_media_get_attribute(media, j);
            if (g_strcmp0(attribute->key, "extmap") == 0 && attribute->value
                && strstr(attribute->value, MID_EXTENSION_URI)) taken = 1;
        }
        if (extension && !taken) g_object_set(extension, "mid", NULL, NULL);
    }
    GstWebRTCSessionDescription *answer = gst_webrtc_session_description_new(GST_WEBRTC_SDP_TYPE_ANSWER, message);
    GstPromise *promise = call(peer->webrtc, "set-remote-description", answer);
    gst_webrtc_session_description_free(answer);
    int failed = reply_error(promise, error, error_size, "setting the answer");
    gst_promise_unref(promise);
    return failed;
}

void CBroadcastWHIP_freeString(char *text) { g_free(text); }

int CBroadcastWHIP_push(CBroadcastWHIPPeer *peer, int video, const uint8_t *data, size_t size, const uint8_t *prefix,
    size_t prefix_size, int64_t pts_ns, int64_t duration_ns, int keyframe, int64_t now_ns) {
    GstElement *src = video ? peer->video : peer->audio;
    if (!src) return -1;
    if (!peer->has_base) {
        GstClock *clock = gst_element_get_clock(peer->pipeline);
        if (!clock) return -1;
        GstClockTime now = gst_clock_get_time(clock);
        gst_object_unref(clock);
        int64_t running = (int64_t)(now - gst_element_get_base_time(peer->pipeline));
        // `now_ns` (the newest media encoded) is now: what waited in the queue is late, sent at
        // once, never held back by the sinks' clock.
        peer->base = running - (now_ns > pts_ns ? now_ns : pts_ns);
        peer->has_base = 1;
    }
    int64_t pts = pts_ns + peer->base;
    if (pts < 0) pts = 0;
    GstBuffer *buffer = gst_buffer_new_allocate(NULL, prefix_size + size, NULL);
    if (!buffer) return -1;
    if (prefix_size) gst_buffer_fill(buffer, 0, prefix, prefix_size);
    gst_buffer_fill(buffer, prefix_size, data, size);
    GST_BUFFER_PTS(buffer) = (GstClockTime)pts;
    GST_BUFFER_DTS(buffer) = (GstClockTime)pts;
    if (duration_ns > 0) GST_BUFFER_DURATION(buffer) = (GstClockTime)duration_ns;
    if (!keyframe) GST_BUFFER_FLAG_SET(buffer, GST_BUFFER_FLAG_DELTA_UNIT);
    return gst_app_src_push_buffer(GST_APP_SRC(src), buffer) == GST_FLOW_OK ? 0 : -1;
}

int CBroadcastWHIP_state(CBroadcastWHIPPeer *peer, char *error, size_t error_size) {
    // No main loop runs the bus: the owner empties it here (it would grow otherwise).
    GstMessage *message;
    while ((message = gst_bus_pop(peer->bus)) != NULL) {
        if (GST_MESSAGE_TYPE(message) == GST_MESSAGE_ERROR) {
            GError *e = NULL;
            gst_message_parse_error(message, &e, NULL);
            snprintf(peer->pipeline_error, sizeof peer->pipeline_error, "%s", e ? e->message : "pipeline error");
            if (e) g_error_free(e);
        } else if (GST_MESSAGE_TYPE(message) == GST_MESSAGE_LATENCY) {
            gst_bin_recalculate_latency(GST_BIN(peer->pipeline));
        }
        gst_message_unref(message);
    }
    if (peer->pipeline_error[0]) {
        set_error(error, error_size, peer->pipeline_error);
        return CBroadcastWHIPState_failed;
    }
    GstWebRTCPeerConnectionState state = GST_WEBRTC_PEER_CONNECTION_STATE_NEW;
    g_object_get(peer->webrtc, "connection-state", &state, NULL);
    switch (state) {
    case GST_WEBRTC_PEER_CONNECTION_STATE_CONNECTED:
        return CBroadcastWHIPState_connected;
    case GST_WEBRTC_PEER_CONNECTION_STATE_FAILED:
        set_error(error, error_size, "the WebRTC connection failed (ICE or DTLS)");
        return CBroadcastWHIPState_failed;
    case GST_WEBRTC_PEER_CONNECTION_STATE_CLOSED:
        set_error(error, error_size, "the WebRTC connection closed");
        return CBroadcastWHIPState_failed;
    default:
        return CBroadcastWHIPState_connecting;
    }
}

uint64_t CBroadcastWHIP_keyframeRequests(CBroadcastWHIPPeer *peer) { return atomic_load(&peer->keyframe_requests); }

uint64_t CBroadcastWHIP_rtcpReceived(CBroadcastWHIPPeer *peer, uint64_t *byes) {
    if (byes) *byes = atomic_load(&peer->byes);
    return atomic_load(&peer->rtcp_received);
}

static gboolean add_stats(GQuark field, const GValue *value, gpointer data) {
    (void)field;
    CBroadcastWHIPStats *stats = data;
    if (!GST_VALUE_HOLDS_STRUCTURE(value)) return TRUE;
    const GstStructure *s = gst_value_get_structure(value);
    GstWebRTCStatsType type = 0;
    if (!gst_structure_get(s, "type", GST_TYPE_WEBRTC_STATS_TYPE, &type, NULL)) return TRUE;
    if (type == GST_WEBRTC_STATS_OUTBOUND_RTP) {
        guint64 bytes = 0, packets = 0;
        if (gst_structure_get_uint64(s, "bytes-sent", &bytes)) stats->bytes_sent += bytes;
        if (gst_structure_get_uint64(s, "packets-sent", &packets)) stats->packets_sent += packets;
    } else if (type == GST_WEBRTC_STATS_REMOTE_INBOUND_RTP) {
        gint lost = 0;
        gint64 lost64 = 0;
        gdouble rtt = 0, fraction = 0;
        stats->has_remote = 1;
        // packets-lost is a gint64 in webrtcbin 1.22 (a gint in older ones).
        if (gst_structure_get_int64(s, "packets-lost", &lost64)) stats->packets_lost += lost64;
        else if (gst_structure_get_int(s, "packets-lost", &lost)) stats->packets_lost += lost;
        // The report's own fields (rtpsession's source stats, nested): a new report moves them.
        const GValue *source = gst_structure_get_value(s, "gst-rtpsource-stats");
        if (source && GST_VALUE_HOLDS_STRUCTURE(source)) {
            const GstStructure *rb = gst_value_get_structure(source);
            guint highest = 0, dlsr = 0;
            gst_structure_get_uint(rb, "rb-exthighestseq", &highest);
            gst_structure_get_uint(rb, "rb-dlsr", &dlsr);
            stats->report_key += ((uint64_t)highest << 32) + dlsr + 1;
        }
        if (gst_structure_get_double(s, "round-trip-time", &rtt) && rtt > stats->round_trip_seconds) stats->round_trip_seconds = rtt;
        if (gst_structure_get_double(s, "fraction-lost", &fraction) && fraction > stats->fraction_lost) stats->fraction_lost = fraction;
    }
    return TRUE;
}

int CBroadcastWHIP_stats(CBroadcastWHIPPeer *peer, CBroadcastWHIPStats *stats) {
    memset(stats, 0, sizeof *stats);
    GstPromise *promise = call(peer->webrtc, "get-stats", NULL);
    const GstStructure *reply = gst_promise_get_reply(promise);
    int result = -1;
    if (reply) {
        gst_structure_foreach(reply, add_stats, stats);
        result = 0;
    }
    gst_promise_unref(promise);
    return result;
}

// MARK: HTTP

typedef struct {
    char *data;
    size_t size;
} Growing;

static void append(Growing *g, const char *bytes, size_t n) {
    char *grown = realloc(g->data, g->size + n + 1);
    if (!grown) return;
    memcpy(grown + g->size, bytes, n);
    g->size += n;
    grown[g->size] = 0;
    g->data = grown;
}

static size_t on_body(char *bytes, size_t size, size_t count, void *data) {
    Growing *g = data;
    // An answer is a few kB: more than 1 MiB is not one.
    if (g->size + size * count > (1u << 20)) return 0;
    append(g, bytes, size * count);
    return size * count;
}

typedef struct {
    Growing location;
    Growing links;
    Growing content_type;
} Headers;

static int header_is(const char *line, size_t n, const char *name, const char **value, size_t *value_size) {
    size_t len = strlen(name);
    if (n <= len || strncasecmp(line, name, len) != 0 || line[len] != ':') return 0;
    const char *v = line + len + 1;
    const char *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
    *value = v;
    *value_size = (size_t)(end - v);
    return 1;
}

static size_t on_header(char *bytes, size_t size, size_t count, void *data) {
    Headers *h = data;
    size_t n = size * count;
    const char *value;
    size_t value_size;
    // A status line starts a new response (after a 100 Continue or a redirect): forget the last.
    if (n >= 5 && strncmp(bytes, "HTTP/", 5) == 0) {
        free(h->location.data);
        free(h->links.data);
        free(h->content_type.data);
        memset(h, 0, sizeof *h);
    } else if (header_is(bytes, n, "location", &value, &value_size)) {
        free(h->location.data);
        h->location = (Growing){0};
        append(&h->location, value, value_size);
    } else if (header_is(bytes, n, "link", &value, &value_size)) {
        if (h->links.size) append(&h->links, "\n", 1);
        append(&h->links, value, value_size);
    } else if (header_is(bytes, n, "content-type", &value, &value_size)) {
        free(h->content_type.data);
        h->content_type = (Growing){0};
        append(&h->content_type, value, value_size);
    }
    return n;
}

/// `location` resolved against `base` (a relative Location is the norm), malloc'd.
static char *resolve(const char *base, const char *location) {
    CURLU *url = curl_url();
    char *resolved = NULL;
    if (url && curl_url_set(url, CURLUPART_URL, base, 0) == CURLUE_OK
        && curl_url_set(url, CURLUPART_URL, location, 0) == CURLUE_OK) {
        char *text = NULL;
        if (curl_url_get(url, CURLUPART_URL, &text, 0) == CURLUE_OK) {
            resolved = strdup(text);
            curl_free(text);
        }
    }
    if (url) curl_url_cleanup(url);
    return resolved ? resolved : strdup(location);
}

int CBroadcastHTTP_request(const char *method, const char *url, const char *token, const char *content_type,
    const char *body, int64_t timeout_ms, const char *ca_file, int verify, CBroadcastAbandonCheck abandon,
    void *abandon_context, CBroadcastHTTPResult *result) {
    pthread_once(&init_once, init_libraries);
    memset(result, 0, sizeof *result);
    CURL *curl = curl_easy_init();
    if (!curl) {
        set_error(result->error, sizeof result->error, "libcurl could not start");
        return -1;
    }
    Growing response = {0};
    Headers headers = {0};
    struct curl_slist *list = NULL;
    char line[4096];
    if (token) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", token);
        list = curl_slist_append(list, line);
    }
    if (content_type) {
        snprintf(line, sizeof line, "Content-Type: %s", content_type);
        list = curl_slist_append(list, line);
    }
    list = curl_slist_append(list, "Expect:");
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "OPTIONS") == 0 || strcmp(method, "DELETE") == 0) {
        if (!body) curl_easy_setopt(curl, CURLOPT_NOBODY, 0L);
    }
    if (body) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &headers);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 1));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, result->error);
    // Redirects would resend the token elsewhere: not followed (307/308 are reported as such).
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, verify ? 1L : 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, verify ? 2L : 0L);
    if (ca_file) curl_easy_setopt(curl, CURLOPT_CAINFO, ca_file);
    // The multi interface, so the wait can be abandoned: curl_easy_perform would hold a stop for
    // the whole timeout while an endpoint takes the connection and never answers.
    CURLcode code = CURLE_FAILED_INIT;
    CURLM *multi = curl_multi_init();
    if (multi && curl_multi_add_handle(multi, curl) == CURLM_OK) {
        int running = 1;
        int abandoned = 0;
        CURLMcode mc = CURLM_OK;
        for (;;) {
            mc = curl_multi_perform(multi, &running);
            if (mc != CURLM_OK || !running) break;
            if (abandon && abandon(abandon_context)) {
                abandoned = 1;
                break;
            }
            mc = curl_multi_poll(multi, NULL, 0, 100, NULL);
            if (mc != CURLM_OK) break;
        }
        if (abandoned) {
            set_error(result->error, sizeof result->error, "abandoned: the output is stopping");
        } else if (mc != CURLM_OK) {
            set_error(result->error, sizeof result->error, curl_multi_strerror(mc));
        } else {
            int left = 0;
            CURLMsg *message;
            while ((message = curl_multi_info_read(multi, &left)) != NULL) {
                if (message->msg == CURLMSG_DONE && message->easy_handle == curl) code = message->data.result;
            }
        }
        curl_multi_remove_handle(multi, curl);
    } else {
        set_error(result->error, sizeof result->error, "libcurl could not start a transfer");
    }
    if (multi) curl_multi_cleanup(multi);
    int rc = -1;
    if (code == CURLE_OK) {
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &result->status);
        result->body = response.data;
        response.data = NULL;
        if (headers.location.data) result->location = resolve(url, headers.location.data);
        result->links = headers.links.data;
        headers.links.data = NULL;
        result->content_type = headers.content_type.data;
        headers.content_type.data = NULL;
        rc = 0;
    } else if (!result->error[0]) {
        set_error(result->error, sizeof result->error, curl_easy_strerror(code));
    }
    free(response.data);
    free(headers.location.data);
    free(headers.links.data);
    free(headers.content_type.data);
    curl_slist_free_all(list);
    curl_easy_cleanup(curl);
    return rc;
}

void CBroadcastHTTP_free(CBroadcastHTTPResult *result) {
    free(result->body);
    free(result->location);
    free(result->links);
    free(result->content_type);
    result->body = result->location = result->links = result->content_type = NULL;
}
