/* The GnuTLS entry points that a static libmicrohttpd built with HTTPS support (Debian's, which
 * gpu-deps/ carries) refers to, for build/gpu/bin/glm5-serve: the GPU machine has no GnuTLS, and
 * glm5-serve never enables TLS (no MHD_USE_TLS), so none of these runs except the global
 * init/deinit that libmicrohttpd's library constructor calls. Each other one fails with GnuTLS's
 * "unimplemented feature" code should it ever be reached. Only the CUDA build (cuda/model.mk)
 * compiles this for real; everywhere else it is empty and the real library is linked. */
#ifdef G5_WITH_CUDA

#include <stddef.h>
#include <stdlib.h>

#define G5_NOTLS_ERR (-1250) /* GNUTLS_E_UNIMPLEMENTED_FEATURE */

int gnutls_global_init(void) { return 0; }
void gnutls_global_deinit(void) {}
const char *gnutls_strerror(int e) {
    (void)e;
    return "TLS is not available in this glm5-serve build";
}
void *gnutls_session_get_ptr(void *session) {
    (void)session;
    return NULL;
}
void *(*gnutls_malloc)(size_t) = malloc;

#define NOTLS(name) \
    int name(void) { return G5_NOTLS_ERR; }
NOTLS(gnutls_alpn_set_protocols)
NOTLS(gnutls_bye)
NOTLS(gnutls_certificate_allocate_credentials)
NOTLS(gnutls_certificate_free_credentials)
NOTLS(gnutls_certificate_server_set_request)
NOTLS(gnutls_certificate_set_dh_params)
NOTLS(gnutls_certificate_set_retrieve_function2)
NOTLS(gnutls_certificate_set_retrieve_function3)
NOTLS(gnutls_certificate_set_x509_key_mem)
NOTLS(gnutls_certificate_set_x509_key_mem2)
NOTLS(gnutls_certificate_set_x509_trust_mem)
NOTLS(gnutls_cipher_get)
NOTLS(gnutls_credentials_set)
NOTLS(gnutls_deinit)
NOTLS(gnutls_dh_params_deinit)
NOTLS(gnutls_dh_params_import_pkcs3)
NOTLS(gnutls_dh_params_init)
NOTLS(gnutls_handshake)
NOTLS(gnutls_init)
NOTLS(gnutls_priority_deinit)
NOTLS(gnutls_priority_init)
NOTLS(gnutls_priority_set)
NOTLS(gnutls_protocol_get_version)
NOTLS(gnutls_psk_allocate_server_credentials)
NOTLS(gnutls_psk_free_server_credentials)
NOTLS(gnutls_psk_set_server_credentials_function)
NOTLS(gnutls_record_check_pending)
NOTLS(gnutls_record_get_direction)
NOTLS(gnutls_record_recv)
NOTLS(gnutls_record_send)
NOTLS(gnutls_session_set_ptr)
NOTLS(gnutls_transport_set_int2)
#undef NOTLS

#else
typedef int rt_serve_notls_unused_;
#endif
