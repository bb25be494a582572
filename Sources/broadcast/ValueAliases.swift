// The value parsers live in BroadcastService (shared with the daemon's config and tested there);
// these names keep the command line's code unchanged.
import BroadcastService

typealias Values = BroadcastService.Values
typealias ValueError = BroadcastService.ValueError
