package statuspage

import (
	"net"
	"slices"
	"strconv"
)

// browserBlockedPorts are the ports browsers refuse to load over HTTP
// (ERR_UNSAFE_PORT in Chromium, "This address is restricted" in
// Firefox): the Fetch standard's "bad port" list, which Chromium's
// kRestrictedPorts (net/base/port_util.cc) and Firefox's gBadPortList
// (netwerk/base/nsIOService.cpp) both hold. 10080 is among them since
// 2021 (NAT slipstreaming), which is why the console left it.
var browserBlockedPorts = []int{
	1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79, 87, 95,
	101, 102, 103, 104, 109, 110, 111, 113, 115, 117, 119, 123, 135, 137, 139, 143, 161, 179,
	389, 427, 465, 512, 513, 514, 515, 526, 530, 531, 532, 540, 548, 554, 556, 563, 587, 601,
	636, 989, 990, 993, 995, 1719, 1720, 1723, 2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566,
	6665, 6666, 6667, 6668, 6669, 6679, 6697, 10080,
}

// BrowserBlocked reports whether browsers refuse to open a page at addr
// (host:port) because of its port, so that a console is never served
// where README's reader cannot open it.
func BrowserBlocked(addr string) bool {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	port, err := strconv.Atoi(p)
	return err == nil && slices.Contains(browserBlockedPorts, port)
}
