#!/usr/bin/env python3
"""A WHIP endpoint (RFC 9725) on aiortc, an independent WebRTC implementation, for broadcast's tests.

POST /whip/NAME (application/sdp offer, Authorization: Bearer TOKEN) -> 201 + Location + answer;
DELETE /session/ID ends it. It decodes what arrives (H.264 through FFmpeg, Opus through libopus)
and reports on GET /state (JSON): requests counted, frames decoded, keyframes seen (IDR in the RTP
payload), and A/V sync: each white frame of the test pattern against the tone's nearest beep onset,
both placed on the sender's clock by its RTCP sender reports (what a player's lip sync uses).
POST /pli sends a Picture Loss Indication on the current video track. POST /loss?fraction=F puts
loss on the path: from then on that fraction of the RTP packets that arrive (chosen at random) is
dropped before aiortc handles them, so its receiver reports count them as lost (as a lossy network
would); GET /state says how many were dropped ("rtp_dropped").

The answer takes the DTLS role aiortc chooses (setup:active: it is the DTLS client, the publisher
the server) unless --setup passive makes it the server; GET /state says which ("setup").

Usage: whip-endpoint.py --port N [--token T] [--link 'stun:host:port'] [--status-after-post N] [--setup active|passive]
"""
import argparse
import array
import asyncio
import json
import logging
import random
import signal
import socket
import time
import uuid

import aioice.ice
import aiortc.rtcrtpreceiver
from aiohttp import web
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.codecs import CODECS
from aiortc.rtcrtpparameters import RTCRtcpFeedback, RTCRtpCodecParameters
from aiortc.rtcrtpreceiver import RTCRtpReceiver
from aiortc.rtcrtpreceiver import RtcpSrPacket

# Accept H.264 High, constrained High and Main as well as aiortc's constrained baseline (a server takes what a
# publisher's encoder makes; aiortc matches profiles exactly).
_FEEDBACK = [RTCRtcpFeedback(type="nack"), RTCRtcpFeedback(type="nack", parameter="pli"), RTCRtcpFeedback(type="goog-remb")]
for pt, profile in ((120, "64001f"), (121, "640c1f"), (122, "4d001f")):
    CODECS["video"].append(RTCRtpCodecParameters(
        mimeType="video/H264", clockRate=90000, payloadType=pt, rtcpFeedback=_FEEDBACK,
        parameters={"level-asymmetry-allowed": "1", "packetization-mode": "1", "profile-level-id": profile}))

state = {
    "posts": 0, "refused": 0, "deletes": 0, "sessions": 0, "video_frames": 0, "audio_frames": 0,
    "video_codec": None, "audio_codec": None, "keyframes": [], "pli_at": None, "white_frames": 0, "beeps": 0, "white_runs": [],
    "loss": 0.0, "rtp_dropped": 0,
}
lossy = random.Random(36)
sender_reports = {}  # kind -> (ntp seconds, rtp timestamp)
ssrcs = {}  # kind -> ssrc
receivers = {}  # kind -> receiver
white_rtp = []  # RTP timestamps (90 kHz) of white frames
beep_rtp = []  # RTP timestamps (48 kHz) of beep onsets
peers = {}

_original_rtp = RTCRtpReceiver._handle_rtp_packet
_original_rtcp = RTCRtpReceiver._handle_rtcp_packet


def is_idr(payload):
    if not payload:
        return False
    nal = payload[0] & 0x1F
    if nal == 5:
        return True
    if nal == 28 and len(payload) > 1:
        return bool(payload[1] & 0x80) and (payload[1] & 0x1F) == 5
    if nal == 24:
        i = 1
        while i + 2 < len(payload):
            size = (payload[i] << 8) | payload[i + 1]
            if payload[i + 2] & 0x1F == 5:
                return True
            i += 2 + size
    return False


async def handle_rtp(self, packet, arrival_time_ms):
    if state["loss"] > 0 and lossy.random() < state["loss"]:
        state["rtp_dropped"] += 1
        return
    kind = self._RTCRtpReceiver__kind
    ssrcs[kind] = packet.ssrc
    receivers[kind] = self
    if kind == "video" and is_idr(packet.payload):
        if not state["keyframes"] or state["keyframes"][-1]["rtp"] != packet.timestamp:
            state["keyframes"].append({"at": time.monotonic(), "rtp": packet.timestamp})
    return await _original_rtp(self, packet, arrival_time_ms)


async def handle_rtcp(self, packet):
    if isinstance(packet, RtcpSrPacket):
        ntp = packet.sender_info.ntp_timestamp
        sender_reports[self._RTCRtpReceiver__kind] = (
            (ntp >> 32) + (ntp & 0xFFFFFFFF) / 2**32, packet.sender_info.rtp_timestamp)
    return await _original_rtcp(self, packet)


# Each ICE socket gets an 8 MB receive buffer: on a loaded machine the event loop can stall for a
# second or two, and the default (about 200 KB) then overflows; the kernel's drops would be loss
# the tests did not put on the path (their receiver reports would say so, and an adaptive
# sender would rightly lower its bitrate).
_connection_made = aioice.ice.StunProtocol.connection_made


def connection_made(self, transport):
    sock = transport.get_extra_info("socket")
    if sock is not None:
        for option in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
            if option is None:
                continue
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, 8 << 20)
                break
            except OSError:
                pass
    return _connection_made(self, transport)


aioice.ice.StunProtocol.connection_made = connection_made
RTCRtpReceiver._handle_rtp_packet = handle_rtp
RTCRtpReceiver._handle_rtcp_packet = handle_rtcp
# Decoded frames keep their RTP timestamps (aiortc would start each track at 0), so the sender
# reports place them.
aiortc.rtcrtpreceiver.TimestampMapper.map = lambda self, timestamp: timestamp


def sender_time(kind, rtp, clock):
    report = sender_reports.get(kind)
    if report is None:
        return None
    delta = (rtp - report[1]) & 0xFFFFFFFF
    if delta >= 2**31:
        delta -= 2**32
    return report[0] + delta / clock


async def consume(track, stop):
    quiet = 0  # samples since the last loud one
    run = 0  # white frames in a row
    last_white = None
    while not stop.is_set():
        try:
            frame = await track.recv()
        except Exception:
            return
        if track.kind == "video":
            state["video_frames"] += 1
            if band_out is not None:
                # benchmarks/glass.py: the frame's top rows in grey, stamped as decoded.
                now = time.monotonic_ns()
                plane = frame.reformat(format="gray").planes[0]
                rows = bytes(plane)
                band = b"".join(rows[y * plane.line_size: y * plane.line_size + frame.width] for y in range(args.band_rows))
                band_out.write(now.to_bytes(8, "little") + band)
            luma = bytes(frame.planes[0])
            sample = luma[:: max(1, len(luma) // 4096)]
            mean = sum(sample) / len(sample)
            # The flash is one frame: a white frame counts once the next one is not white (a run of
            # them is counted apart, as something else).
            if mean > 200:
                run += 1
                last_white = frame.pts
            else:
                if run == 1:
                    state["white_frames"] += 1
                    white_rtp.append(last_white)
                elif run > 1:
                    state["white_runs"].append(run)
                run = 0
        else:
            state["audio_frames"] += 1
            samples = array.array("h", bytes(frame.planes[0]))
            channels = len(frame.layout.channels)
            for i in range(0, len(samples), channels):
                if abs(samples[i]) > 3000:
                    if quiet > 0.3 * frame.sample_rate:
                        state["beeps"] += 1
                        beep_rtp.append(frame.pts + i // channels)
                    quiet = 0
                else:
                    quiet += 1


async def post(request):
    state["posts"] += 1
    if args.status_after_post and state["posts"] > args.status_after_post:
        return web.Response(status=503)
    if args.token is not None and request.headers.get("Authorization") != f"Bearer {args.token}":
        state["refused"] += 1
        return web.Response(status=401, text="wrong token")
    if request.content_type != "application/sdp":
        return web.Response(status=415)
    offer = RTCSessionDescription(sdp=await request.text(), type="offer")
    pc = RTCPeerConnection()
    stop = asyncio.Event()
    session = uuid.uuid4().hex
    peers[session] = (pc, stop)

    @pc.on("track")
    def on_track(track):
        asyncio.ensure_future(consume(track, stop))

    try:
        await pc.setRemoteDescription(offer)
    except Exception as error:
        logging.error("offer refused (%s):\n%s", error, offer.sdp)
        await pc.close()
        return web.Response(status=400, text=str(error))
    if args.setup == "passive":
        for transceiver in pc.getTransceivers():
            transceiver.receiver.transport._set_role("server")
    answer = await pc.createAnswer()
    await pc.setLocalDescription(answer)
    # The codec each m-section settled on: the answer's first rtpmap.
    kind = None
    for line in pc.localDescription.sdp.splitlines():
        if line.startswith("a=setup:"):
            state["setup"] = line[len("a=setup:"):]
        if line.startswith("m="):
            kind = line[2:].split()[0]
        elif line.startswith("a=rtpmap:") and kind and not state.get(kind + "_codec_set"):
            state[kind + "_codec"] = line.split()[1]
            state[kind + "_codec_set"] = True
    state["sessions"] += 1
    headers = {"Location": f"/session/{session}", "Content-Type": "application/sdp"}
    if args.link:
        headers["Link"] = f'<{args.link}>; rel="ice-server"'
    return web.Response(status=201, text=pc.localDescription.sdp, headers=headers)


async def delete(request):
    state["deletes"] += 1
    entry = peers.pop(request.match_info["id"], None)
    if entry is None:
        return web.Response(status=404)
    pc, stop = entry
    stop.set()
    await pc.close()
    return web.Response(status=200)


async def pli(request):
    receiver = receivers.get("video")
    if receiver is None or "video" not in ssrcs:
        return web.Response(status=409, text="no video yet")
    state["pli_at"] = time.monotonic()
    await receiver._send_rtcp_pli(ssrcs["video"])
    return web.json_response({"pli_at": state["pli_at"]})


async def loss(request):
    state["loss"] = float(request.query["fraction"])
    return web.json_response({"loss": state["loss"]})


async def get_state(request):
    result = dict(state)
    now = time.monotonic()
    result["keyframe_ages"] = [now - k["at"] for k in state["keyframes"]]
    # A keyframe the encoder made on request rather than at a scene cut (the test pattern's white
    # frame each second makes x264 start one): more than two frames from every white frame.
    forced = [k for k in state["keyframes"] if all(abs((k["rtp"] - w + 2**31) % 2**32 - 2**31) > 6000 for w in white_rtp)]
    result["forced_keyframes"] = len(forced)
    if state["pli_at"] is not None:
        after = [k["at"] - state["pli_at"] for k in forced if k["at"] >= state["pli_at"]]
        result["forced_keyframe_after_pli"] = after[0] if after else None
    del result["keyframes"]
    result["keyframes"] = len(state["keyframes"])
    # Each white frame against the nearest beep onset, on the sender's clock (seconds, audio - video).
    videos = [t for t in (sender_time("video", r, 90000) for r in white_rtp) if t is not None]
    audios = [t for t in (sender_time("audio", r, 48000) for r in beep_rtp) if t is not None]
    result["sync_offsets"] = [min((a - v for a in audios), key=abs) for v in videos] if audios else []
    return web.json_response(result)


async def main():
    app = web.Application()
    app.router.add_post("/whip/{name:.*}", post)
    app.router.add_delete("/session/{id}", delete)
    app.router.add_post("/pli", pli)
    app.router.add_post("/loss", loss)
    app.router.add_get("/state", get_state)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    print("listening", flush=True)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, done.set)
    await done.wait()
    for pc, stop in list(peers.values()):
        stop.set()


parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--token")
parser.add_argument("--link")
parser.add_argument("--status-after-post", type=int, default=0)
parser.add_argument("--setup", choices=["active", "passive"], default="active",
                    help="the answer's DTLS role: active (aiortc's own choice: the endpoint is the DTLS client) or passive")
parser.add_argument("--band-out", help="write each decoded frame's top rows (grey) to this file, for benchmarks/glass.py")
parser.add_argument("--band-rows", type=int, default=96)
args = parser.parse_args()
band_out = open(args.band_out, "wb", buffering=0) if args.band_out else None
logging.basicConfig(level=logging.WARNING)
asyncio.run(main())
