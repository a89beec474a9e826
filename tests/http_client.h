/* A small blocking HTTP/1.1 client over loopback for the server tests (tests/test_serve.c on the
 * CPU, tests/gpu/test_gpu_serve.c on the GPU): one request per connection, the whole response read
 * until the server closes, chunked bodies joined. Include once per test program, after
 * <stdlib.h>/<string.h>. g_auth, when set, is sent with every request. */
#ifndef G5_TESTS_HTTP_CLIENT_H
#define G5_TESTS_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

typedef struct hresp {
    int status;
    char *raw;
    size_t raw_len;
    char *body; /* de-chunked, NUL-terminated */
    size_t body_len;
} hresp;

static void hresp_free(hresp *r) {
    free(r->raw);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static int tcp_connect(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {120, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static char *recv_all(int fd, size_t *n) {
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) b = realloc(b, cap *= 2);
        ssize_t k = recv(fd, b + len, cap - len - 1, 0);
        if (k <= 0) break;
        len += (size_t)k;
    }
    b[len] = 0;
    *n = len;
    return b;
}

static int parse_resp(char *raw, size_t n, hresp *r) {
    r->raw = raw;
    r->raw_len = n;
    r->status = 0;
    if (sscanf(raw, "HTTP/1.%*d %d", &r->status) != 1) return -1;
    char *he = strstr(raw, "\r\n\r\n");
    if (!he) return -1;
    *he = 0;
    int chunked = strcasestr(raw, "\r\ntransfer-encoding: chunked") != NULL;
    *he = '\r';
    char *p = he + 4, *end = raw + n;
    r->body = malloc((size_t)(end - p) + 1);
    size_t w = 0;
    if (!chunked) {
        memcpy(r->body, p, (size_t)(end - p));
        w = (size_t)(end - p);
    } else {
        while (p < end) {
            char *e;
            unsigned long sz = strtoul(p, &e, 16);
            char *nl = strstr(p, "\r\n");
            if (!nl || e == p) break;
            p = nl + 2;
            if (sz == 0) break;
            if (sz > (size_t)(end - p)) sz = (size_t)(end - p);
            memcpy(r->body + w, p, sz);
            w += sz;
            p += sz + 2;
        }
    }
    r->body[w] = 0;
    r->body_len = w;
    return 0;
}

static const char *g_auth; /* "Authorization: Bearer ...\r\n" added to every request, or NULL */

static int http_send_req(int fd, const char *method, const char *path, const char *hdrs, const char *body,
                         size_t blen) {
    char head[2048];
    int k = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, body ? "Content-Type: application/json\r\n" : "", g_auth ? g_auth : "",
                     hdrs ? hdrs : "", body ? blen : 0);
    if (send_all(fd, head, (size_t)k)) return -1;
    return body && blen ? send_all(fd, body, blen) : 0;
}

static int http_do(uint16_t port, const char *method, const char *path, const char *hdrs, const char *body,
                   hresp *r) {
    memset(r, 0, sizeof *r);
    int fd = tcp_connect(port);
    if (fd < 0) return -1;
    if (http_send_req(fd, method, path, hdrs, body, body ? strlen(body) : 0)) {
        close(fd);
        return -1;
    }
    size_t n;
    char *raw = recv_all(fd, &n);
    close(fd);
    if (parse_resp(raw, n, r)) {
        r->raw = raw;
        return -1;
    }
    return 0;
}

#endif
