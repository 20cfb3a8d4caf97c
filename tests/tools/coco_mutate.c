/* coco_mutate IN.json OUT.json
 *
 * The awkward annotations of a detector test, made from a generated COCO
 * file without Python: every box of the first image becomes a crowd box
 * (a crowd-only image), and the last annotation's box gets width 0 (a
 * degenerate box).  Exit 0, or 2 on a usage or file error. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

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

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: coco_mutate IN.json OUT.json\n");
        return 2;
    }
    char *text = slurp(argv[1]);
    cJSON *d = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *imgs = cJSON_GetObjectItem(d, "images"), *anns = cJSON_GetObjectItem(d, "annotations");
    cJSON *first = cJSON_GetObjectItem(cJSON_GetArrayItem(imgs, 0), "id");
    int n = cJSON_GetArraySize(anns);
    if (!d || !cJSON_IsNumber(first) || n < 1) {
        fprintf(stderr, "coco_mutate: %s: not a COCO file with images and annotations\n", argv[1]);
        return 2;
    }
    for (int i = 0; i < n; i++) {
        cJSON *a = cJSON_GetArrayItem(anns, i);
        cJSON *img = cJSON_GetObjectItem(a, "image_id");
        if (cJSON_IsNumber(img) && img->valuedouble == first->valuedouble) {
            cJSON_DeleteItemFromObject(a, "iscrowd");
            cJSON_AddNumberToObject(a, "iscrowd", 1);
        }
    }
    cJSON *bbox = cJSON_GetObjectItem(cJSON_GetArrayItem(anns, n - 1), "bbox");
    if (cJSON_GetArraySize(bbox) != 4) {
        fprintf(stderr, "coco_mutate: the last annotation has no 4-number bbox\n");
        return 2;
    }
    cJSON_ReplaceItemInArray(bbox, 2, cJSON_CreateNumber(0));
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
