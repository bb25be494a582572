#pragma once
// libcurl: the WHIP output's HTTP (POST of the offer, DELETE of the session). Only CWebRTCShim
// includes it.
#include <curl/curl.h>
