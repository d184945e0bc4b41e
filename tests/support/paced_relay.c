/* tests/support/paced_relay.py in C: the benches' native floor, what a relay paced at one wake a
 * frame costs this machine when no interpreter runs in it (the kernel's share, and the thread's).
 *
 *     paced_relay HOST PORT FRAME_US READ_BYTES HELD_BYTES
 *
 * Listens on a free loopback port, prints it, and relays each connection to HOST:PORT byte for byte as
 * the Python relay does: the client's bytes as they come, the engine's first two reads as they come,
 * then one read a frame (SO_RCVLOWAT at HELD_BYTES, SO_RCVTIMEO the frame), each read (of up to
 * READ_BYTES) written on in one write. The sizes and the frame are the app's, given by the caller.
 * Runs until its standard input closes. Built by tests.support.paced_relay.native_relay. */

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static struct sockaddr_in engine_address;
static long frame_us;
static int read_bytes, held_bytes;

struct link {
    int client, engine;
};

static int send_all(int fd, const char *data, ssize_t size) {
    while (size > 0) {
        ssize_t sent = send(fd, data, (size_t)size, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return -1;
        data += sent;
        size -= sent;
    }
    return 0;
}

static void *upstream(void *arg) {
    struct link *link = arg;
    char buffer[64 * 1024];
    ssize_t got;
    while ((got = recv(link->client, buffer, sizeof buffer, 0)) > 0)
        if (send_all(link->engine, buffer, got) < 0) break;
    return NULL;
}

static void *relay(void *arg) {
    struct link *link = arg;
    char *buffer = malloc((size_t)read_bytes);
    int one = 1, reads = 0;
    pthread_t up;
    link->engine = socket(AF_INET, SOCK_STREAM, 0);
    if (buffer == NULL || link->engine < 0 ||
        connect(link->engine, (struct sockaddr *)&engine_address, sizeof engine_address) < 0)
        goto done;
    setsockopt(link->engine, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (pthread_create(&up, NULL, upstream, link) != 0) goto done;
    for (;;) {
        if (reads == 2) {
            int held = held_bytes;
            struct timeval frame = {frame_us / 1000000, frame_us % 1000000};
            setsockopt(link->engine, SOL_SOCKET, SO_RCVLOWAT, &held, sizeof held);
            setsockopt(link->engine, SOL_SOCKET, SO_RCVTIMEO, &frame, sizeof frame);
        }
        ssize_t got = recv(link->engine, buffer, (size_t)read_bytes, 0);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (got <= 0) break;
        reads++;
        if (send_all(link->client, buffer, got) < 0) break;
    }
    shutdown(link->client, SHUT_RDWR);  /* ends the upstream thread's read */
    shutdown(link->engine, SHUT_RDWR);
    pthread_join(up, NULL);
done:
    if (link->engine >= 0) close(link->engine);
    close(link->client);
    free(buffer);
    free(link);
    return NULL;
}

static void *accept_all(void *arg) {
    int listener = *(int *)arg, one = 1;
    for (;;) {
        int client = accept(listener, NULL, NULL);
        if (client < 0) continue;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct link *link = malloc(sizeof *link);
        pthread_t thread;
        if (link == NULL) {
            close(client);
            continue;
        }
        link->client = client;
        link->engine = -1;
        if (pthread_create(&thread, NULL, relay, link) != 0) {
            close(client);
            free(link);
            continue;
        }
        pthread_detach(thread);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s HOST PORT FRAME_US READ_BYTES HELD_BYTES\n", argv[0]);
        return 2;
    }
    engine_address.sin_family = AF_INET;
    engine_address.sin_port = htons((unsigned short)atoi(argv[2]));
    frame_us = atol(argv[3]);
    read_bytes = atoi(argv[4]);
    held_bytes = atoi(argv[5]);
    if (read_bytes <= 0 || held_bytes <= 0) {
        fprintf(stderr, "READ_BYTES and HELD_BYTES must be positive\n");
        return 2;
    }
    if (inet_pton(AF_INET, argv[1], &engine_address.sin_addr) != 1) {
        fprintf(stderr, "%s is not an IPv4 address\n", argv[1]);
        return 2;
    }
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in address = {0};
    socklen_t size = sizeof address;
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof address) < 0 ||
        listen(listener, 64) < 0 || getsockname(listener, (struct sockaddr *)&address, &size) < 0) {
        perror("listen");
        return 1;
    }
    printf("%d\n", ntohs(address.sin_port));
    fflush(stdout);
    pthread_t thread;
    if (pthread_create(&thread, NULL, accept_all, &listener) != 0) return 1;
    char byte;
    while (read(STDIN_FILENO, &byte, 1) > 0) {
    }
    return 0; /* the parent closed the pipe */
}
