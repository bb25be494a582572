#!/usr/bin/env python3
"""A minimal WHIP front-end (RFC 9725) for a Janus gateway's VideoRoom, for broadcast's tests.

Debian's simple-whip-server does the same in Node.js; this one is the standard library alone. Each
POST /whip/NAME (application/sdp offer, Authorization: Bearer TOKEN when --token is given) becomes a
Janus session on Janus's HTTP API (--janus, e.g. http://127.0.0.1:8088/janus): attach
janus.plugin.videoroom, create room --room (once; H.264 and Opus, recorded into --rec-dir as .mjr
files), "joinandconfigure" as a publisher with the offer; the answer Janus sends back is the 201's
body, with Location /whip/resource/SESSION. DELETE of that Location destroys the Janus session (which
closes the recordings). Janus itself decides what it takes: this front-end forwards the SDP as it is,
unless --strip-ssrc, which takes the offer's a=ssrc/a=ssrc-group lines out (Janus must then tell the
streams apart by the RTP header extension urn:ietf:params:rtp-hdrext:sdes:mid), or --refuse-mid,
which takes that extension's a=extmap out of the answer (an endpoint that does not take it).

GET /state answers JSON: posts, refused, deletes, sessions, the offers and answers, and Janus's
events for each session (webrtcup, media, hangup, ...).

Usage: janus-whip.py --port N --janus URL --room N --rec-dir DIR [--token T] [--strip-ssrc] [--refuse-mid]
"""
import argparse
import json
import re
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
state = {"posts": 0, "refused": 0, "deletes": 0, "sessions": 0, "offers": [], "answers": [], "events": []}
room_ready = False
# Janus session id -> {"handle": id, "events": list of events, "answers": {transaction: jsep}}
sessions = {}


def janus(path, body, timeout=30):
    """POSTs one Janus API request; the parsed reply."""
    body = dict(body, transaction=uuid.uuid4().hex)
    request = urllib.request.Request(args.janus + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read()), body["transaction"]


def janus_error(reply):
    if reply.get("janus") == "error":
        return reply.get("error", {}).get("reason", "error")
    data = reply.get("plugindata", {}).get("data", {})
    if "error" in data:
        return "%s (%s)" % (data["error"], data.get("error_code"))
    return None


def poll(session_id):
    """Long-polls the session's events until Janus no longer knows it."""
    while True:
        try:
            with urllib.request.urlopen("%s/%d?maxev=10" % (args.janus, session_id), timeout=60) as reply:
                events = json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError):
            return
        if isinstance(events, dict):
            events = [events]
        for event in events:
            if event.get("janus") == "error":
                return
            if event.get("janus") == "keepalive":
                continue
            with lock:
                session = sessions.get(session_id)
                if session is None:
                    return
                session["events"].append(event)
                state["events"].append({"session": session_id, "event": event})
                if "jsep" in event and event.get("transaction"):
                    session["answers"][event["transaction"]] = event["jsep"]
                session["condition"].notify_all()


def create_room():
    global room_ready
    if room_ready:
        return
    reply, _ = janus("", {"janus": "create"})
    session = reply["data"]["id"]
    reply, _ = janus("/%d" % session, {"janus": "attach", "plugin": "janus.plugin.videoroom"})
    handle = reply["data"]["id"]
    reply, _ = janus("/%d/%d" % (session, handle), {"janus": "message", "body": {
        "request": "create", "room": args.room, "publishers": 4, "videocodec": "h264", "audiocodec": "opus",
        "record": True, "rec_dir": args.rec_dir}})
    error = janus_error(reply)
    if error and "already exists" not in error:
        raise RuntimeError("creating the room: " + error)
    janus("/%d" % session, {"janus": "destroy"})
    room_ready = True


def publish(offer):
    """A Janus session publishing `offer` in the room; (session id, answer SDP)."""
    create_room()
    reply, _ = janus("", {"janus": "create"})
    session_id = reply["data"]["id"]
    reply, _ = janus("/%d" % session_id, {"janus": "attach", "plugin": "janus.plugin.videoroom"})
    handle = reply["data"]["id"]
    session = {"handle": handle, "events": [], "answers": {}, "condition": threading.Condition(lock)}
    with lock:
        sessions[session_id] = session
    threading.Thread(target=poll, args=(session_id,), daemon=True).start()
    reply, transaction = janus("/%d/%d" % (session_id, handle), {
        "janus": "message", "body": {"request": "joinandconfigure", "room": args.room, "ptype": "publisher",
                                     "display": "broadcast", "audio": True, "video": True},
        "jsep": {"type": "offer", "sdp": offer, "trickle": False}})
    error = janus_error(reply)
    if error:
        raise RuntimeError(error)
    with lock:
        if not session["condition"].wait_for(lambda: transaction in session["answers"] or any(
                janus_error(e) for e in session["events"] if e.get("transaction") == transaction), timeout=30):
            raise RuntimeError("Janus sent no answer")
        jsep = session["answers"].get(transaction)
        if jsep is None:
            raise RuntimeError(next(janus_error(e) for e in session["events"] if e.get("transaction") == transaction))
    return session_id, jsep["sdp"]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *arguments):
        pass

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self):
        if args.token is None or self.headers.get("Authorization") == "Bearer " + args.token:
            return True
        with lock:
            state["refused"] += 1
        self.reply(401)
        return False

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length).decode()
        with lock:
            state["posts"] += 1
        if not self.path.startswith("/whip/") or not self.authorized():
            if not self.path.startswith("/whip/"):
                self.reply(404)
            return
        offer = body
        if args.strip_ssrc:
            offer = re.sub(r"a=ssrc(-group)?:[^\r\n]*\r?\n", "", offer)
        try:
            session_id, answer = publish(offer)
        except Exception as error:  # noqa: BLE001 - the reason goes back to the client
            self.reply(500, ("janus: %s\n" % error).encode(), [("Content-Type", "text/plain")])
            return
        if args.refuse_mid:
            answer = re.sub(r"a=extmap:[^\r\n]*urn:ietf:params:rtp-hdrext:sdes:mid[^\r\n]*\r?\n", "", answer)
        with lock:
            state["sessions"] += 1
            state["offers"].append(body)
            state["answers"].append(answer)
        self.reply(201, answer.encode(), [("Content-Type", "application/sdp"),
                                          ("Location", "/whip/resource/%d" % session_id)])

    def do_DELETE(self):
        with lock:
            state["deletes"] += 1
        match = re.fullmatch(r"/whip/resource/(\d+)", self.path)
        if not match or not self.authorized():
            if not match:
                self.reply(404)
            return
        session_id = int(match.group(1))
        with lock:
            known = session_id in sessions
        if not known:
            self.reply(404)
            return
        try:
            janus("/%d" % session_id, {"janus": "destroy"})
        except (urllib.error.URLError, OSError) as error:
            self.reply(500, ("janus: %s\n" % error).encode())
            return
        self.reply(200)

    def do_GET(self):
        if self.path != "/state":
            self.reply(404)
            return
        with lock:
            body = json.dumps(state).encode()
        self.reply(200, body, [("Content-Type", "application/json")])


parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--janus", required=True)
parser.add_argument("--room", type=int, default=1234)
parser.add_argument("--rec-dir", required=True)
parser.add_argument("--token")
parser.add_argument("--strip-ssrc", action="store_true")
parser.add_argument("--refuse-mid", action="store_true")
args = parser.parse_args()

server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
print("listening on 127.0.0.1:%d" % args.port, flush=True)
server.serve_forever()
