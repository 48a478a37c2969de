/*
 * pace_streams: an LD_PRELOAD library that caps every TCP socket a program opens at
 * XFER_PACE_MBIT Mbit/s with SO_MAX_PACING_RATE, the same per-stream cap xfer sets with
 * --stream-rate-cap and iperf3 with --fq-rate. The benchmark harness uses it for tools that
 * have no such option (globus-url-copy). Sockets accepted from a capped listening socket
 * inherit its cap. Without XFER_PACE_MBIT, or with a value that is not a positive number,
 * nothing changes.
 *
 *   cc -O2 -shared -fPIC -o libpace_streams.so pace_streams.c -ldl
 *   XFER_PACE_MBIT=50 LD_PRELOAD=./libpace_streams.so globus-url-copy ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>

static void cap(int fd)
{
	const char *text = getenv("XFER_PACE_MBIT");
	char *end;
	double mbit;
	uint64_t rate;
	uint32_t rate32;
	int saved = errno;

	if (!text)
		return;
	mbit = strtod(text, &end);
	if (end == text || *end != '\0' || !(mbit > 0))
		return;
	rate = (uint64_t)(mbit * 1e6 / 8);
	/* Kernels before 4.20 take only 32 bits (up to 34 Gbit/s). */
	if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) != 0) {
		rate32 = rate > UINT32_MAX ? UINT32_MAX : (uint32_t)rate;
		setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate32, sizeof(rate32));
	}
	errno = saved;
}

int socket(int domain, int type, int protocol)
{
	static int (*real_socket)(int, int, int);
	int fd;

	if (!real_socket)
		real_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
	fd = real_socket(domain, type, protocol);
	if (fd >= 0 && (domain == AF_INET || domain == AF_INET6) &&
	    (type & 0xff) == SOCK_STREAM)
		cap(fd);
	return fd;
}
