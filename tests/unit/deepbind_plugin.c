/*
 * A plugin that test_dlopen opens with RTLD_DEEPBIND: it reports which
 * malloc and free it bound to, and allocates and frees blocks that cross
 * the program/plugin boundary.
 */
#include <stdlib.h>
#include <string.h>

void *plugin_free_address(void);
void *plugin_malloc_address(void);
char *plugin_strdup(const char *s);
void plugin_free(void *p);

/* Taken through the plugin's GOT: the definition its lookup scope found. */
void *plugin_free_address(void)
{
    return (void *)&free;
}

void *plugin_malloc_address(void)
{
    return (void *)&malloc;
}

char *plugin_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

void plugin_free(void *p)
{
    free(p);
}
