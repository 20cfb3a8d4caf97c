/* coco_mutate IN.json OUT.json EDIT=INDEX...
 *
 * The awkward annotations of a detector test, made from a generated COCO
 * file without Python.  Each EDIT=INDEX is a row of the table below,
 * applied in order; INDEX counts images (empty, crowd) or annotations
 * (degenerate, outside, noseg) from 0, a negative one from the end:
 *   empty=I       image I's annotations removed (an image without objects)
 *   crowd=I       every box of image I a crowd box (a crowd-only image)
 *   degenerate=A  annotation A's box width 0
 *   outside=A     annotation A's segmentation one polygon reaching far
 *                 outside its image
 *   noseg=A       annotation A without a segmentation
 * Exit 0, or 2 on a usage or file error. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) free(b), b = NULL;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

/* the annotations of the image with id `id` (a number): each passed to fn */
static void for_image(cJSON *anns, const cJSON *id, void (*fn)(cJSON *anns, int i))
{
    for (int i = cJSON_GetArraySize(anns) - 1; i >= 0; i--) {
        cJSON *img = cJSON_GetObjectItem(cJSON_GetArrayItem(anns, i), "image_id");
        if (cJSON_IsNumber(img) && img->valuedouble == id->valuedouble) fn(anns, i);
    }
}

static void drop(cJSON *anns, int i) { cJSON_DeleteItemFromArray(anns, i); }

static void make_crowd(cJSON *anns, int i)
{
    cJSON *a = cJSON_GetArrayItem(anns, i);
    cJSON_DeleteItemFromObject(a, "iscrowd");
    cJSON_AddNumberToObject(a, "iscrowd", 1);
}

static int edit_empty(cJSON *imgs, cJSON *anns, int i)
{
    cJSON *id = cJSON_GetObjectItem(cJSON_GetArrayItem(imgs, i), "id");
    if (!cJSON_IsNumber(id)) return -1;
    for_image(anns, id, drop);
    return 0;
}

static int edit_crowd(cJSON *imgs, cJSON *anns, int i)
{
    cJSON *id = cJSON_GetObjectItem(cJSON_GetArrayItem(imgs, i), "id");
    if (!cJSON_IsNumber(id)) return -1;
    for_image(anns, id, make_crowd);
    return 0;
}

static int edit_degenerate(cJSON *imgs, cJSON *anns, int i)
{
    (void)imgs;
    cJSON *bbox = cJSON_GetObjectItem(cJSON_GetArrayItem(anns, i), "bbox");
    if (cJSON_GetArraySize(bbox) != 4) return -1;
    cJSON_ReplaceItemInArray(bbox, 2, cJSON_CreateNumber(0));
    return 0;
}

static int edit_outside(cJSON *imgs, cJSON *anns, int i)
{
    (void)imgs;
    static const double poly[] = {1, 1, 500, 2, 3, 400};
    cJSON *a = cJSON_GetArrayItem(anns, i), *segm = cJSON_CreateArray();
    cJSON_AddItemToArray(segm, cJSON_CreateDoubleArray(poly, 6));
    cJSON_DeleteItemFromObject(a, "segmentation");
    cJSON_AddItemToObject(a, "segmentation", segm);
    return 0;
}

static int edit_noseg(cJSON *imgs, cJSON *anns, int i)
{
    (void)imgs;
    cJSON_DeleteItemFromObject(cJSON_GetArrayItem(anns, i), "segmentation");
    return 0;
}

static const struct edit {
    const char *name;
    int of_images; /* INDEX counts images, else annotations */
    int (*apply)(cJSON *imgs, cJSON *anns, int i);
} EDITS[] = {
    {"empty", 1, edit_empty},       {"crowd", 1, edit_crowd},  {"degenerate", 0, edit_degenerate},
    {"outside", 0, edit_outside},   {"noseg", 0, edit_noseg},
};

static int apply(const char *arg, cJSON *imgs, cJSON *anns)
{
    const char *eq = strchr(arg, '=');
    char *end;
    long idx = eq ? strtol(eq + 1, &end, 10) : 0;
    for (size_t e = 0; eq && *end == 0 && e < sizeof EDITS / sizeof EDITS[0]; e++) {
        if (strlen(EDITS[e].name) != (size_t)(eq - arg) || strncmp(arg, EDITS[e].name, eq - arg))
            continue;
        int n = cJSON_GetArraySize(EDITS[e].of_images ? imgs : anns);
        if (idx < 0) idx += n;
        if (idx < 0 || idx >= n || EDITS[e].apply(imgs, anns, (int)idx) < 0) {
            fprintf(stderr, "coco_mutate: %s: no such %s\n", arg,
                    EDITS[e].of_images ? "image" : "annotation (with a bbox)");
            return -1;
        }
        return 0;
    }
    fprintf(stderr, "coco_mutate: %s: not EDIT=INDEX (empty, crowd, degenerate, outside, noseg)\n",
            arg);
    return -1;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: coco_mutate IN.json OUT.json EDIT=INDEX...\n");
        return 2;
    }
    char *text = slurp(argv[1]);
    cJSON *d = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *imgs = cJSON_GetObjectItem(d, "images"), *anns = cJSON_GetObjectItem(d, "annotations");
    if (!cJSON_IsArray(imgs) || !cJSON_IsArray(anns)) {
        fprintf(stderr, "coco_mutate: %s: not a COCO file with images and annotations\n", argv[1]);
        cJSON_Delete(d);
        return 2;
    }
    for (int a = 3; a < argc; a++)
        if (apply(argv[a], imgs, anns) < 0) {
            cJSON_Delete(d);
            return 2;
        }
    char *out = cJSON_PrintUnformatted(d);
    FILE *f = fopen(argv[2], "w");
    int ok = out && f && fputs(out, f) >= 0;
    if (f && fclose(f)) ok = 0;
    free(out);
    cJSON_Delete(d);
    if (!ok) {
        fprintf(stderr, "coco_mutate: cannot write %s\n", argv[2]);
        return 2;
    }
    return 0;
}
