/*
 * Unit tests for wk_net: loopback is decided by parsing the address, not by
 * its spelling; NNG URLs of the worker link split into scheme and host.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "wk_net.h"

static void
test_loopback_literals(void **state)
{
    (void)state;
    const char *yes[] = {"127.0.0.1", "127.5.6.7", "127.255.255.254", "::1", "[::1]",
                         "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "[::ffff:127.9.9.9]"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        assert_true(wk_net_host_is_loopback(yes[i]));
    const char *no[] = {"0.0.0.0", "::", "[::]", "*", "", "10.0.0.1", "192.168.1.1",
                        "128.0.0.1", "126.255.255.255", "::2", "::ffff:10.0.0.1", "[127.0.0.1]",
                        "[::1", "::1]", "2001:db8::1"};
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        assert_false(wk_net_host_is_loopback(no[i]));
    assert_false(wk_net_host_is_loopback(NULL));
}

static void
test_loopback_names(void **state)
{
    (void)state;
    /* a name that merely starts like a loopback address is not one */
    assert_false(wk_net_host_is_loopback("127.0.0.1.invalid"));
    assert_false(wk_net_host_is_loopback("127.evil.invalid"));
    assert_false(wk_net_host_is_loopback("no-such-host.invalid"));
    /* localhost resolves (from /etc/hosts) to loopback addresses only */
    assert_true(wk_net_host_is_loopback("localhost"));
}

static void
test_url_parse(void **state)
{
    (void)state;
    wk_net_scheme sc;
    char host[64];
    wk_diag d = {{0}};
    assert_int_equal(wk_net_url_parse("ipc:///tmp/x.ipc", &sc, host, sizeof(host), &d), WK_OK);
    assert_int_equal(sc, WK_NET_SCHEME_IPC);
    assert_string_equal(host, "");
    assert_int_equal(wk_net_url_parse("tcp://127.0.0.1:7070", &sc, host, sizeof(host), &d),
                     WK_OK);
    assert_int_equal(sc, WK_NET_SCHEME_TCP);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(wk_net_url_parse("tcp6://[::1]:7070", &sc, host, sizeof(host), &d), WK_OK);
    assert_string_equal(host, "::1");
    assert_int_equal(wk_net_url_parse("tls+tcp://10.77.0.1:7443", &sc, host, sizeof(host), &d),
                     WK_OK);
    assert_int_equal(sc, WK_NET_SCHEME_TLS);
    assert_string_equal(host, "10.77.0.1");
    assert_int_equal(wk_net_url_parse("tls+tcp4://ctl.example:1", &sc, host, sizeof(host), &d),
                     WK_OK);
    assert_string_equal(host, "ctl.example");
    const char *bad[] = {"ws://127.0.0.1:1", "tcp://127.0.0.1", "tcp://:7070", "tcp://::1:70",
                         "tcp://[::1]", "tcp://h:70000", "tcp://h:7a", "ipc://", "inproc://x",
                         "tls+ipc:///x", "tcp://h:"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        strcpy(host, "untouched");
        memset(&d, 0, sizeof(d));
        assert_int_equal(wk_net_url_parse(bad[i], &sc, host, sizeof(host), &d), WK_EINVAL);
        assert_true(d.msg[0] != '\0');
        assert_string_equal(host, "untouched");
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loopback_literals),
        cmocka_unit_test(test_loopback_names),
        cmocka_unit_test(test_url_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
