/* Decode only the part of a JPEG a crop needs, at the smallest DCT scale that still gives the
 * crop enough pixels (libjpeg-turbo: jpeg_crop_scanline, jpeg_skip_scanlines, scale_num/8).
 *
 *   size(data) -> (width, height)
 *   region(data, left, top, width, height, min_side) -> (rgb bytearray, w, h, scale_num)
 *
 * The box is in full-size pixels; the answer is that box at scale scale_num/8 (its edges
 * rounded outwards), RGB, row-major. Rows below the box are never decoded, rows above are
 * skipped without colour conversion, and columns outside the iMCU-aligned box are neither
 * transformed nor converted. The GIL is released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

struct error_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
    struct error_mgr *err = (struct error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_warning(j_common_ptr cinfo, int level) {
    /* level -1: corrupt data (a truncated file, say). libjpeg would go on with grey pixels;
     * fail instead, so the caller hands the file to Pillow, which decides as it always did */
    if (level < 0) on_error(cinfo);
}

/* Errors and corrupt-data warnings longjmp to err->jump. The setjmp itself must stay in the
 * function that decodes: a jmp_buf is valid only while the frame that set it lives. */
static void use_errors(struct jpeg_decompress_struct *cinfo, struct error_mgr *err) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_warning;
}

static PyObject *size(PyObject *self, PyObject *args) {
    Py_buffer data;
    struct jpeg_decompress_struct cinfo;
    struct error_mgr err;
    PyObject *out = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    use_errors(&cinfo, &err);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "not a JPEG this decoder reads: %s", err.message);
        return NULL;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    out = Py_BuildValue("(II)", cinfo.image_width, cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return out;
}

static PyObject *region(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int left, top, width, height, min_side;
    struct jpeg_decompress_struct cinfo;
    struct error_mgr err;
    PyObject *volatile pixels = NULL;
    unsigned char *volatile row = NULL;
    volatile int started = 0;
    PyThreadState *volatile _save = NULL;
    unsigned int num = 8, x0, y0, x1, y1, w, h, y;
    JDIMENSION xoff, cw;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*IIIII", &data, &left, &top, &width, &height, &min_side)) return NULL;
    if (width == 0 || height == 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "an empty box");
        return NULL;
    }
    /* the smallest k/8 that keeps at least min_side pixels on both sides of the box */
    for (num = 1; num < 8; num++)
        if ((unsigned long)width * num >= (unsigned long)min_side * 8 &&
            (unsigned long)height * num >= (unsigned long)min_side * 8) break;
    use_errors(&cinfo, &err);
    if (setjmp(err.jump)) {
        if (started) Py_BLOCK_THREADS
        jpeg_destroy_decompress(&cinfo);
        PyMem_RawFree((void *)row);
        Py_XDECREF((PyObject *)pixels);
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "cannot decode this JPEG: %s", err.message);
        return NULL;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    if (left + width > cinfo.image_width || top + height > cinfo.image_height) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "the box %u,%u %ux%u is outside the %ux%u image", left, top, width, height,
                     cinfo.image_width, cinfo.image_height);
        return NULL;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = num;
    cinfo.scale_denom = 8;
    cinfo.dct_method = JDCT_ISLOW; /* what Pillow uses: the same pixels */
    jpeg_start_decompress(&cinfo);
    /* the box at this scale, edges rounded outwards, inside the scaled image */
    x0 = (unsigned int)(((unsigned long)left * num) / 8);
    y0 = (unsigned int)(((unsigned long)top * num) / 8);
    x1 = (unsigned int)((((unsigned long)(left + width)) * num + 7) / 8);
    y1 = (unsigned int)((((unsigned long)(top + height)) * num + 7) / 8);
    if (x1 > cinfo.output_width) x1 = cinfo.output_width;
    if (y1 > cinfo.output_height) y1 = cinfo.output_height;
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + 1;
    w = x1 - x0;
    h = y1 - y0;
    pixels = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)w * h * 3); /* writable: torch shares it */
    if (pixels == NULL) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        return NULL;
    }
    Py_UNBLOCK_THREADS
    started = 1;
    /* one more column each side: upsampled chroma at the box's edges then has its neighbours,
     * so the pixels are the ones a whole-image decode gives (jpeg_crop_scanline treats the
     * region's edges as the image's) */
    xoff = x0 > 0 ? x0 - 1 : 0;
    cw = (x1 < cinfo.output_width ? x1 + 1 : x1) - xoff;
    jpeg_crop_scanline(&cinfo, &xoff, &cw); /* widens to iMCU boundaries */
    row = (unsigned char *)PyMem_RawMalloc((size_t)cw * 3);
    if (row == NULL) {
        strcpy(err.message, "out of memory");
        longjmp(err.jump, 1);
    }
    if (y0 > 0) jpeg_skip_scanlines(&cinfo, y0);
    for (y = 0; y < h; y++) {
        JSAMPROW rows[1] = {(JSAMPROW)row};
        if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
            strcpy(err.message, "the image ends early");
            longjmp(err.jump, 1);
        }
        memcpy(PyByteArray_AS_STRING((PyObject *)pixels) + (size_t)y * w * 3, row + (size_t)(x0 - xoff) * 3, (size_t)w * 3);
    }
    jpeg_abort_decompress(&cinfo); /* the rows below the box are never decoded */
    jpeg_destroy_decompress(&cinfo);
    Py_BLOCK_THREADS
    PyMem_RawFree((void *)row);
    PyBuffer_Release(&data);
    return Py_BuildValue("(NIII)", (PyObject *)pixels, w, h, num);
}

static PyMethodDef methods[] = {
    {"size", size, METH_VARARGS, "size(jpeg) -> (width, height)"},
    {"region", region, METH_VARARGS,
     "region(jpeg, left, top, width, height, min_side) -> (rgb, w, h, scale_num): the box, decoded at scale_num/8"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg", "Region and reduced-scale JPEG decoding.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__jpeg(void) { return PyModule_Create(&module); }
