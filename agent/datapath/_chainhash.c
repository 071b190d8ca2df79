/*
 * agent.datapath._chainhash: the hot loop of agent/datapath/hashing.py in C (optional; agent/datapath/hashing.py falls back to Python).
 *
 * vLLM 0.33.0 hashes every full block as hash_fn((parent, tuple(block tokens), extra_keys)). Block i's input
 * holds block i-1's digest, so the chain is sequential and, in Python, costs one encoder call, one digest
 * call and a few bytes concatenations per block (about 1 us; 8,192 blocks for a 128k-token prompt at block
 * size 16). Here each block's message is assembled in one reused buffer and hashed with OpenSSL's SHA-256
 * or, when xxhash.h (Debian libxxhash-dev) was found at build time, XXH3-128 (the Python package xxhash's
 * xxh3_128_digest: the canonical big-endian 16 bytes, seed 0), with the GIL released.
 *
 * The caller (agent/datapath/hashing.py) derives the constant parts of a message from the real encoder, so this file
 * only knows how a token id is encoded:
 *   message = head || parent || mid || enc(token) for each token of the block || post
 *   head[frame_at : frame_at + 8] = little-endian length of the message after it (pickle protocol >= 4 FRAME)
 * Token encodings (each byte-identical to the Python encoder, checked by tests/agent/datapath/test_hashing_native.py):
 *   ENC_PICKLE: pickle BININT1 (0x4b, 1 byte) below 256, BININT2 (0x4d, 2 bytes LE) below 65536, else BININT
 *               (0x4a, 4 bytes LE) below 2**31: CPython's save_long for non-negative ints of 32-bit range.
 *   ENC_CBOR:   RFC 8949 preferred (canonical) unsigned int, as cbor2: the value itself below 24, else
 *               0x18/0x19/0x1a/0x1b then 1/2/4/8 big-endian bytes, the shortest that holds it.
 *   ENC_U32LE:  4 bytes little-endian below 2**32 (SGLang 0.5.23's page hash input; head, mid and post empty).
 * A token outside the encoding's range, or anything but an exact int (bool encodes differently), makes the
 * call return None so that the caller uses the Python encoder.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <string.h>
#if defined(__has_include)
#if __has_include(<xxhash.h>)
#define XXH_INLINE_ALL
#include <xxhash.h>
#define HAVE_XXH3 1
#endif
#endif
#ifndef HAVE_XXH3
#define HAVE_XXH3 0
#endif

enum { ENC_PICKLE = 0, ENC_CBOR = 1, ENC_U32LE = 2 };
enum { DIGEST_SHA256 = 0, DIGEST_XXH3_128 = 1 };

/* Fetched once: EVP_sha256() would make every EVP_DigestInit_ex look the implementation up again (OpenSSL 3). */
static EVP_MD *sha256_md;

/* Reads count exact-int tokens into out; 0 on success, 1 when one is out of [0, limit) or not an exact int. */
static int read_tokens(PyObject *seq, Py_ssize_t start, Py_ssize_t count, unsigned long long limit, unsigned long long *out) {
    PyObject **items = PySequence_Fast_ITEMS(seq) + start;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = items[i];
        if (!PyLong_CheckExact(item)) return 1;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || v < 0 || (unsigned long long)v >= limit) {
            if (v == -1 && PyErr_Occurred()) PyErr_Clear();
            return 1;
        }
        out[i] = (unsigned long long)v;
    }
    return 0;
}

static size_t encode_pickle(unsigned long long v, unsigned char *p) {
    if (v < 256) { p[0] = 0x4b; p[1] = (unsigned char)v; return 2; }
    if (v < 65536) { p[0] = 0x4d; p[1] = v & 0xff; p[2] = (v >> 8) & 0xff; return 3; }
    p[0] = 0x4a;
    for (int k = 0; k < 4; k++) p[1 + k] = (v >> (8 * k)) & 0xff;
    return 5;
}

static size_t encode_cbor(unsigned long long v, unsigned char *p) {
    int width;
    if (v < 24) { p[0] = (unsigned char)v; return 1; }
    if (v < 256) { p[0] = 0x18; width = 1; }
    else if (v < 65536) { p[0] = 0x19; width = 2; }
    else if (v < 4294967296ULL) { p[0] = 0x1a; width = 4; }
    else { p[0] = 0x1b; width = 8; }
    for (int k = 0; k < width; k++) p[1 + k] = (v >> (8 * (width - 1 - k))) & 0xff;
    return (size_t)width + 1;
}

static size_t encode_u32le(unsigned long long v, unsigned char *p) {
    for (int k = 0; k < 4; k++) p[k] = (v >> (8 * k)) & 0xff;
    return 4;
}

PyDoc_STRVAR(hash_chain_doc,
"hash_chain(tokens, start, block_size, count, parent, head, frame_at, mid, post, encoding, digest)\n"
"-> list[bytes] | None\n\n"
"Digests of count chained blocks (digest 0: SHA-256, 32 bytes; 1: XXH3-128, 16 bytes, only if XXH3 is True):\n"
"block i hashes head || parent_i || mid ||\n"
"enc(tokens[start + i*block_size : start + (i+1)*block_size]) || post, where parent_0 = parent and parent_i =\n"
"digest of block i-1. tokens: list or tuple of ints (at least start + count*block_size); frame_at: offset\n"
"in head of an 8-byte little-endian length of the rest of the message, or -1; encoding: 0 pickle ints, 1\n"
"canonical CBOR unsigned ints, 2 little-endian u32. Returns None when a token is not an exact int in the encoding's range.\n"
"Raises TypeError/ValueError on malformed arguments, MemoryError, RuntimeError if OpenSSL fails.");

static PyObject *hash_chain(PyObject *self, PyObject *args) {
    PyObject *tokens;
    Py_ssize_t start, block_size, count, frame_at;
    Py_buffer parent, head, mid, post;
    int encoding, digest;
    if (!PyArg_ParseTuple(args, "Onnny*y*ny*y*ii", &tokens, &start, &block_size, &count, &parent, &head, &frame_at,
                          &mid, &post, &encoding, &digest))
        return NULL;
    PyObject *result = NULL, *seq = NULL;
    unsigned long long *vals = NULL;
    unsigned char *msg = NULL, *digests = NULL;
    EVP_MD_CTX *ctx = NULL;

    const Py_ssize_t dsize = digest == DIGEST_SHA256 ? 32 : 16;
    if (start < 0 || block_size <= 0 || count < 0 || encoding < ENC_PICKLE || encoding > ENC_U32LE
        || !(digest == DIGEST_SHA256 || (digest == DIGEST_XXH3_128 && HAVE_XXH3)) || parent.len != dsize
        || frame_at < -1 || (frame_at >= 0 && frame_at + 8 > head.len)) {
        PyErr_SetString(PyExc_ValueError,
                        "hash_chain: bad start, block_size, count, digest, parent length, frame_at or encoding");
        goto done;
    }
    if (count > PY_SSIZE_T_MAX / block_size) { PyErr_NoMemory(); goto done; }
    seq = PySequence_Fast(tokens, "tokens must be a list or tuple of ints");
    if (seq == NULL) goto done;
    Py_ssize_t ntok = count * block_size;
    if (PySequence_Fast_GET_SIZE(seq) - start < ntok) {
        PyErr_SetString(PyExc_ValueError, "hash_chain: fewer tokens than start + count * block_size");
        goto done;
    }
    vals = PyMem_Malloc(sizeof(*vals) * (size_t)(ntok ? ntok : 1));
    size_t per_token = encoding == ENC_CBOR ? 9 : 5;
    size_t cap = (size_t)head.len + (size_t)dsize + (size_t)mid.len + per_token * (size_t)block_size + (size_t)post.len;
    msg = PyMem_Malloc(cap);
    digests = PyMem_Malloc((size_t)dsize * (size_t)(count ? count : 1));
    ctx = EVP_MD_CTX_new();
    if (vals == NULL || msg == NULL || digests == NULL || ctx == NULL) { PyErr_NoMemory(); goto done; }
    unsigned long long limit = encoding == ENC_PICKLE ? (1ULL << 31) : encoding == ENC_CBOR ? (1ULL << 63) : (1ULL << 32);
    if (read_tokens(seq, start, ntok, limit, vals)) {
        result = Py_NewRef(Py_None);
        goto done;
    }

    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    memcpy(msg, head.buf, (size_t)head.len);
    const size_t parent_at = (size_t)head.len, body_at = parent_at + (size_t)dsize + (size_t)mid.len;
    memcpy(msg + parent_at, parent.buf, (size_t)dsize);
    memcpy(msg + parent_at + dsize, mid.buf, (size_t)mid.len);
    for (Py_ssize_t b = 0; b < count && ok; b++) {
        size_t n = body_at;
        const unsigned long long *v = vals + b * block_size;
        if (encoding == ENC_PICKLE)
            for (Py_ssize_t t = 0; t < block_size; t++) n += encode_pickle(v[t], msg + n);
        else if (encoding == ENC_CBOR)
            for (Py_ssize_t t = 0; t < block_size; t++) n += encode_cbor(v[t], msg + n);
        else
            for (Py_ssize_t t = 0; t < block_size; t++) n += encode_u32le(v[t], msg + n);
        memcpy(msg + n, post.buf, (size_t)post.len);
        n += (size_t)post.len;
        if (frame_at >= 0) {
            unsigned long long rest = (unsigned long long)(n - (size_t)frame_at - 8);
            for (int k = 0; k < 8; k++) msg[frame_at + k] = (rest >> (8 * k)) & 0xff;
        }
        unsigned char *out = digests + (size_t)b * (size_t)dsize;
        if (digest == DIGEST_SHA256) {
            ok = EVP_DigestInit_ex(ctx, sha256_md, NULL) && EVP_DigestUpdate(ctx, msg, n)
                 && EVP_DigestFinal_ex(ctx, out, NULL);
        }
#if HAVE_XXH3
        else {
            XXH128_canonical_t c;
            XXH128_canonicalFromHash(&c, XXH3_128bits(msg, n));
            memcpy(out, c.digest, 16);
        }
#endif
        memcpy(msg + parent_at, out, (size_t)dsize);
    }
    Py_END_ALLOW_THREADS
    if (!ok) { PyErr_SetString(PyExc_RuntimeError, "hash_chain: OpenSSL SHA-256 failed"); goto done; }

    result = PyList_New(count);
    if (result == NULL) goto done;
    for (Py_ssize_t b = 0; b < count; b++) {
        PyObject *d = PyBytes_FromStringAndSize((const char *)digests + (size_t)b * (size_t)dsize, dsize);
        if (d == NULL) { Py_CLEAR(result); goto done; }
        PyList_SET_ITEM(result, b, d);
    }
done:
    if (ctx) EVP_MD_CTX_free(ctx);
    PyMem_Free(vals);
    PyMem_Free(msg);
    PyMem_Free(digests);
    Py_XDECREF(seq);
    PyBuffer_Release(&parent);
    PyBuffer_Release(&head);
    PyBuffer_Release(&mid);
    PyBuffer_Release(&post);
    return result;
}

PyDoc_STRVAR(hex_keys_doc,
"hex_keys(prefix, digests, suffixes) -> list[str] | None\n\n"
"Object keys prefix + digest.hex() + suffix for every digest (bytes) and every suffix (tuple of str), block-major:\n"
"[d0+s0, d0+s1, d1+s0, ...]. Returns None when prefix or a suffix is not ASCII (the caller builds those in Python).\n"
"Raises TypeError when a digest is not bytes.");

static PyObject *hex_keys(PyObject *self, PyObject *args) {
    PyObject *prefix, *digests, *suffixes;
    if (!PyArg_ParseTuple(args, "UOO!", &prefix, &digests, &PyTuple_Type, &suffixes)) return NULL;
    Py_ssize_t nsuf = PyTuple_GET_SIZE(suffixes);
    if (!PyUnicode_IS_ASCII(prefix)) Py_RETURN_NONE;
    for (Py_ssize_t s = 0; s < nsuf; s++) {
        PyObject *suf = PyTuple_GET_ITEM(suffixes, s);
        if (!PyUnicode_Check(suf)) { PyErr_SetString(PyExc_TypeError, "suffixes must be str"); return NULL; }
        if (!PyUnicode_IS_ASCII(suf)) Py_RETURN_NONE;
    }
    PyObject *seq = PySequence_Fast(digests, "digests must be a sequence of bytes");
    if (seq == NULL) return NULL;
    static const char hexdigits[] = "0123456789abcdef";
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), plen = PyUnicode_GET_LENGTH(prefix);
    const Py_UCS1 *pdata = PyUnicode_1BYTE_DATA(prefix);
    PyObject *out = PyList_New(n * (nsuf ? nsuf : 1));
    if (out == NULL) { Py_DECREF(seq); return NULL; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyBytes_Check(d)) { PyErr_SetString(PyExc_TypeError, "digests must be bytes"); goto fail; }
        Py_ssize_t dlen = PyBytes_GET_SIZE(d);
        const unsigned char *db = (const unsigned char *)PyBytes_AS_STRING(d);
        for (Py_ssize_t s = 0; s < (nsuf ? nsuf : 1); s++) {
            PyObject *suf = nsuf ? PyTuple_GET_ITEM(suffixes, s) : NULL;
            Py_ssize_t slen = suf ? PyUnicode_GET_LENGTH(suf) : 0;
            PyObject *key = PyUnicode_New(plen + 2 * dlen + slen, 127);
            if (key == NULL) goto fail;
            Py_UCS1 *k = PyUnicode_1BYTE_DATA(key);
            memcpy(k, pdata, (size_t)plen);
            for (Py_ssize_t j = 0; j < dlen; j++) {
                k[plen + 2 * j] = hexdigits[db[j] >> 4];
                k[plen + 2 * j + 1] = hexdigits[db[j] & 15];
            }
            if (slen) memcpy(k + plen + 2 * dlen, PyUnicode_1BYTE_DATA(suf), (size_t)slen);
            PyList_SET_ITEM(out, i * (nsuf ? nsuf : 1) + s, key);
        }
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"hash_chain", hash_chain, METH_VARARGS, hash_chain_doc},
    {"hex_keys", hex_keys, METH_VARARGS, hex_keys_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "agent.datapath._chainhash",
    "Compiled chained block hashing for agent/datapath/hashing.py (see the C source's header comment).", -1, methods,
};

PyMODINIT_FUNC PyInit__chainhash(void) {
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (sha256_md == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "XXH3", HAVE_XXH3 ? Py_True : Py_False) < 0) Py_CLEAR(m);
    return m;
}
