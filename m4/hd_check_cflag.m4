# HD_CHECK_CFLAG(FLAGS, [ACTION-IF-OK], [ACTION-IF-NOT])
# Checks that the C compiler accepts FLAGS (with warnings as errors, so that
# an ignored flag does not count) when compiling and linking a small program.
AC_DEFUN([HD_CHECK_CFLAG], [
    AS_VAR_PUSHDEF([hd_var], [hd_cv_cflag_$1])
    AC_CACHE_CHECK([whether $CC accepts $1], [hd_var], [
        hd_save_CFLAGS=$CFLAGS
        CFLAGS="$CFLAGS -Werror $1"
        AC_LINK_IFELSE([AC_LANG_PROGRAM([[]], [[return 0;]])],
                       [AS_VAR_SET([hd_var], [yes])],
                       [AS_VAR_SET([hd_var], [no])])
        CFLAGS=$hd_save_CFLAGS
    ])
    AS_VAR_IF([hd_var], [yes], [$2], [$3])
    AS_VAR_POPDEF([hd_var])
])
