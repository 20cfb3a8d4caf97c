/* psdata: dataset tools for the video and detection pipelines.
 *   psdata gen-video  writes the moving-texture direction dataset
 *   psdata gen-det    writes the shapes-on-clutter detection dataset (COCO)
 *   psdata pack       packs a list's frames into shards for sequential reads
 *   psdata check      loads a list (or a pack) and decodes every frame
 *   psdata extract    decodes a list of video files into frame folders or shards
 *   psdata csv-lists  turns annotation CSVs (Kinetics) into lists of video files
 *   psdata check-det  loads COCO annotations, decodes every image and mask */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/labels.h"
#include "worker/data/ps_video.h"
#include "worker/data/ps_image.h"
#include "worker/data/video_extract.h"
#include "worker/data/video_file.h"
#include "worker/data/video_gen.h"
#include "worker/det/coco_json.h"
#include "worker/det/gen_det.h"

/* Every option, whichever command it belongs to: all commands share one
 * option table, so a command accepts (and ignores) the others' flags. */
typedef struct {
    const char *cmd;
    int is_det;                    /* gen-det: --classes has the detector's range */
    /* gen-det: -1 = the generator's default; its size defaults to 128 */
    int det_images, det_val, det_size, det_classes, det_quality, det_minobj, det_maxobj;
    int det_masks;                 /* gen-det --masks */
    double det_minsz, det_maxsz;
    uint64_t det_seed;
    ps_video_gen_opts_t g;         /* gen-video */
    ps_video_list_opts_t lo;       /* pack, check */
    const char *list, *out, *packed, *json;
    int shard_videos;
    const char *container;         /* gen-video: write video files of this container */
    double fps;                    /* gen-video: video rate (0 = 25); extract: output rate */
    int gop, bframes, threads, short_side, quality_set;
    ps_csv_lists_opts_t cl;        /* csv-lists */
} args_t;

static void args_init(args_t *a, const char *cmd)
{
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->is_det = !strcmp(cmd, "gen-det");
    a->det_images = 2000;
    a->det_val = a->det_classes = a->det_quality = a->det_minobj = a->det_maxobj = -1;
    a->det_size = 128;
    a->det_minsz = a->det_maxsz = -1;
    a->det_seed = 1;
    ps_video_gen_opts_default(&a->g);
    ps_video_list_opts_default(&a->lo);
    a->shard_videos = 256;
    a->short_side = 256;
}

static int cmd_gen_video(args_t *a)
{
    char err[2048];
    if (a->out) a->g.out = a->out;
    if (ps_video_gen(&a->g, err, sizeof err) < 0) {
        fprintf(stderr, "psdata: gen-video: %s\n", err);
        return 1;
    }
    printf("wrote %d videos of %d frames (%dx%d, %d classes) to %s: train.txt, val.txt\n",
           a->g.videos, a->g.frames, a->g.size, a->g.size, a->g.classes, a->g.out);
    return 0;
}

static int cmd_gen_det(args_t *a)
{
    char err[2048];
    ps_det_gen_opts_t d;
    ps_det_gen_defaults(&d, a->det_images);
    if (a->det_val >= 0) d.n_val = a->det_val;
    if (a->det_classes > 0) d.classes = a->det_classes;
    if (a->det_quality > 0) d.quality = a->det_quality;
    if (a->det_minobj > 0) d.min_objects = a->det_minobj;
    if (a->det_maxobj > 0) d.max_objects = a->det_maxobj;
    if (a->det_minsz > 0) d.min_size = (float)a->det_minsz;
    if (a->det_maxsz > 0) d.max_size = (float)a->det_maxsz;
    d.masks = a->det_masks;
    const char *out = a->out ? a->out : "data/det";
    int rc = ps_det_gen(out, a->det_images, a->det_size, a->det_seed, &d, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "psdata: %s\n", err);
        return rc == PS_EINVAL ? 2 : 1;
    }
    printf("wrote %d train + %d val images (%dx%d, %d classes, %d..%d objects%s) to %s: "
           "annotations/instances_train.json, annotations/instances_val.json\n", a->det_images,
           d.n_val, a->det_size, a->det_size, d.classes, d.min_objects, d.max_objects,
           d.masks ? ", instance masks" : "", out);
    return 0;
}

/* The list (--list) or pack (--packed) pack and check read: 0, or the exit code */
static int load_list(const args_t *a, ps_video_list_t **l)
{
    char err[2048];
    int rc;
    if (a->packed) {
        rc = ps_video_list_load_packed(a->packed, &a->lo, l, err, sizeof err);
    } else {
        if (!a->list) {
            fprintf(stderr, "psdata: %s needs --list (see --help)\n", a->cmd);
            return 2;
        }
        rc = ps_video_list_load(a->list, &a->lo, l, err, sizeof err);
    }
    if (rc < 0) {
        fprintf(stderr, "psdata: %s\n", err);
        return 1;
    }
    return 0;
}

static int cmd_pack(args_t *a)
{
    ps_video_list_t *l = NULL;
    int rc = load_list(a, &l);
    if (rc) return rc;
    if (!a->out) {
        fprintf(stderr, "psdata: pack needs --out DIR\n");
        ps_video_list_free(&l);
        return 2;
    }
    char err[2048];
    rc = ps_video_pack(l, a->out, a->shard_videos, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "psdata: pack: %s\n", err);
    else
        printf("packed %zu videos (%zu skipped) into %s, %d per shard\n", ps_video_list_size(l),
               ps_video_list_skipped(l), a->out, a->shard_videos);
    ps_video_list_free(&l);
    return rc < 0 ? 1 : 0;
}

/* Decodes every frame; a frame that fails is reported and counted, and makes the exit 1 */
static int cmd_check(args_t *a)
{
    ps_video_list_t *l = NULL;
    int rc = load_list(a, &l);
    if (rc) return rc;
    char err[2048];
    size_t frames = 0, bad = 0;
    for (size_t i = 0; i < ps_video_list_size(l); i++)
        for (int f = 1; f <= ps_video_list_frames(l, i); f++) {
            uint8_t *px;
            int w, h;
            if (ps_video_read_frame(l, i, f, &px, &w, &h, err, sizeof err) < 0) {
                fprintf(stderr, "psdata: %s\n", err);
                bad++;
            } else {
                free(px);
            }
            frames++;
        }
    printf("videos=%zu skipped=%zu classes=%d frames=%zu bad_frames=%zu\n", ps_video_list_size(l),
           ps_video_list_skipped(l), ps_video_list_num_classes(l), frames, bad);
    ps_video_list_free(&l);
    return bad ? 1 : 0;
}

/* Image i of c (under root): decodes at the size the JSON gives; 0 or -1
 * with the reason on stderr */
static int check_image(const ps_coco_t *c, int i, const char *root)
{
    char path[4096], err[1024];
    const ps_coco_image_t *im = &c->images[i];
    snprintf(path, sizeof path, "%s%s%s", root, *root ? "/" : "", im->file_name);
    uint8_t *buf = NULL, *rgb = NULL;
    size_t len;
    int w = 0, h = 0;
    int rc = ps_read_file(path, &buf, &len, err, sizeof err);
    if (!rc) rc = ps_jpeg_decode(buf, len, &rgb, &w, &h, err, sizeof err);
    free(buf);
    free(rgb);
    if (!rc && (w != im->width || h != im->height))
        snprintf(err, sizeof err, "image is %dx%d, the annotations say %dx%d", w, h, im->width,
                 im->height), rc = -1;
    if (rc) fprintf(stderr, "psdata: %s: %s\n", path, err);
    return rc ? -1 : 0;
}

/* COCO annotations (strict, or --skip-bad), every image decoded and every
 * segmentation turned into its mask; counts on stdout, exit 1 when
 * anything was bad */
static int cmd_check_det(args_t *a)
{
    char err[2048];
    ps_coco_t c;
    ps_coco_skips_t sk;
    if (!a->json) {
        fprintf(stderr, "psdata: check-det needs --json (see --help)\n");
        return 2;
    }
    if (ps_coco_load(&c, a->json, a->lo.skip_bad, &sk, err, sizeof err) < 0) {
        fprintf(stderr, "psdata: %s\n", err);
        return 1;
    }
    int *inst = calloc((size_t)c.nimages + 1, sizeof(int));
    size_t bad = 0, kinds[4] = {0}, crowd = 0, empty_masks = 0, no_inst = 0;
    for (int k = 0; inst && k < c.nanns; k++) {
        const ps_coco_ann_t *an = &c.anns[k];
        int im = ps_coco_find_image(&c, an->image_id);
        kinds[an->segm.kind]++;
        crowd += an->iscrowd;
        if (!an->iscrowd && an->bbox[2] > 0 && an->bbox[3] > 0) inst[im]++;
        ps_rle_t r;
        if (an->segm.kind == PS_COCO_SEGM_NONE) continue;
        if (ps_coco_segm_rle(&an->segm, c.images[im].height, c.images[im].width, &r) < 0) {
            fprintf(stderr, "psdata: %s: annotation %lld: out of memory\n", a->json,
                    (long long)an->id);
            bad++;
            continue;
        }
        empty_masks += ps_rle_area(&r) == 0;
        ps_rle_free(&r);
    }
    for (int i = 0; inst && i < c.nimages; i++) {
        no_inst += inst[i] == 0;
        if (check_image(&c, i, a->lo.root ? a->lo.root : "")) bad++;
    }
    printf("images=%d annotations=%d crowd=%zu polygons=%zu rle=%zu no_segmentation=%zu "
           "empty_masks=%zu images_without_instances=%zu skipped_records=%d bad=%zu\n",
           c.nimages, c.nanns, crowd, kinds[PS_COCO_SEGM_POLY],
           kinds[PS_COCO_SEGM_RLE] + kinds[PS_COCO_SEGM_RLE_STR], kinds[PS_COCO_SEGM_NONE],
           empty_masks, no_inst, sk.images + sk.anns, bad);
    int ret = !inst || bad ? 1 : 0;
    free(inst);
    ps_coco_free(&c);
    return ret;
}

static int cmd_gen_video_files(args_t *a)
{
    char err[2048];
    if (a->out) a->g.out = a->out;
    ps_vfile_enc_t enc = { a->fps > 0 ? (int)a->fps : 25, a->gop > 0 ? a->gop : 8, 3, a->bframes };
    if (ps_video_gen_files(&a->g, a->container, &enc, err, sizeof err) < 0) {
        fprintf(stderr, "psdata: gen-video: %s\n", err);
        return 1;
    }
    printf("wrote %d %s videos of %d frames (%dx%d, %d fps, keyframe every %d, %d B-frames, %d classes) to %s: "
           "labels.csv, classes.txt\n", a->g.videos, a->container, a->g.frames, a->g.size, a->g.size, enc.fps,
           enc.gop, enc.bframes, a->g.classes, a->g.out);
    return 0;
}

static int cmd_gen(args_t *a) { return a->container ? cmd_gen_video_files(a) : cmd_gen_video(a); }

static int cmd_extract(args_t *a)
{
    ps_video_extract_opts_t o;
    ps_video_extract_opts_default(&o);
    o.list = a->list;
    o.root = a->lo.root;
    o.out = a->out;
    o.packed = a->packed;
    o.short_side = a->short_side;
    o.fps = a->fps;
    o.threads = a->threads;
    if (a->quality_set) o.quality = a->g.quality;
    o.shard_videos = a->shard_videos;
    ps_video_extract_stats_t st;
    char err[2048];
    int rc = ps_video_extract(&o, &st, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "psdata: extract: %s\n", err);
        return rc == PS_EINVAL || rc == PS_EMISMATCH ? 2 : 1;
    }
    printf("extract: %zu videos: %zu extracted (%zu frames), %zu done before, %zu bad%s\n", st.videos,
           st.extracted, st.frames, st.done_before, st.bad, st.bad ? " (named above; not in the output)" : "");
    return st.bad ? 1 : 0;
}

static int cmd_csv_lists(args_t *a)
{
    ps_csv_lists_stats_t st;
    char err[2048];
    a->cl.root = a->lo.root[0] ? a->lo.root : NULL;
    a->cl.out = a->out;
    int rc = ps_csv_to_lists(&a->cl, &st, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "psdata: csv-lists: %s\n", err);
        return rc == PS_EINVAL && !st.rows ? 2 : 1;
    }
    printf("csv-lists: %zu rows: %zu listed, %zu without a video file, %zu without a label; %d classes\n",
           st.rows, st.listed, st.missing, st.unlabelled, st.classes);
    return 0;
}

/* The subcommands: name, one line for the usage text, the options text printed
 * under it, and the handler (which returns the exit code). */
static const struct command {
    const char *name, *help, *options;
    int (*run)(args_t *a);
} COMMANDS[] = {
    {"gen-video", "write a direction-of-motion video dataset in the TSM list format",
"      --out DIR          output directory (default data/direction)\n"
"      --videos N         number of videos, train + val (default 400)\n"
"      --frames F         frames per video (default 16)\n"
"      --size S           frame width and height in pixels (default 64)\n"
"      --seed X           dataset seed (default 1)\n"
"      --classes C        2 (up/down), 4 (up/down/left/right), 8 (+diagonals); default 4\n"
"      --val-fraction V   share of videos in val.txt (default 0.2)\n"
"      --quality Q        JPEG quality (default 90)\n"
"      --speed P          pixels per frame (default size/16, +-25% per video)\n"
"      --clutter X        static shapes: X * (6 + size^2/256) (default 0.5)\n"
"      --movers X         moving shapes: X * (4 + size^2/512) (default 3)\n"
"      --container C      write video files instead: MPEG-4 part 2 in C (mp4, avi,\n"
"                         mkv, mov); the size must be even\n"
"      --fps R            video files: frames per second (default 25)\n"
"      --gop N            video files: a keyframe every N frames (default 8)\n"
"      --bframes N        video files: B-frames between references (default 0)\n"
"    Writes DIR/vid_NNNNNN/img_00001.jpg ... and DIR/train.txt, DIR/val.txt\n"
"    (lines 'vid_NNNNNN num_frames label'; use DIR as the root).  With\n"
"    --container: DIR/vid_NNNNNN_000000_EEEEEE.C (Kinetics' file names), a\n"
"    Kinetics-style DIR/labels.csv (label,youtube_id,time_start,time_end,split)\n"
"    and DIR/classes.txt (the class names in label order).\n",
     cmd_gen},
    {"gen-det", "write a shapes-on-clutter detection dataset: JPEGs + COCO JSON",
"      --out DIR          output directory (default data/det)\n"
"      --images N         training images (default 2000)\n"
"      --val-images N     validation images (default max(1, N/5))\n"
"      --size S           image width and height in pixels (default 128)\n"
"      --classes C        shape classes 1..6 (circle, square, triangle, diamond,\n"
"                         cross, ring; default 5)\n"
"      --masks            instance masks as COCO 'segmentation': polygons along the\n"
"                         pixel edges (exact), compressed RLE for the ring's hole\n"
"      --min-objects N, --max-objects N   objects per image (default 2..6)\n"
"      --min-size F, --max-size F         object side / image side (0.12..0.40)\n"
"      --seed X           dataset seed (default 1)\n"
"      --quality Q        JPEG quality (default 90)\n"
"    Writes DIR/train/NNNNNN.jpg, DIR/val/NNNNNN.jpg and\n"
"    DIR/annotations/instances_{train,val}.json (COCO's layout).\n",
     cmd_gen_det},
    {"pack", "pack a list's JPEG frames into shards (concatenated JPEGs + index)",
"      --list L           TSM list file\n"
"      --root R           directory the list's frame_dir entries are relative to\n"
"      --tmpl T           frame file name template (default img_%05d.jpg)\n"
"      --out DIR          output directory for shard-NNNNN.bin / .idx\n"
"      --shard-videos N   videos per shard (default 256)\n"
"      --skip-bad         drop bad list entries (counted) instead of failing\n"
"    psworker reads DIR with --packed; samples are identical to the folder reader.\n",
     cmd_pack},
    {"check", "load a list (or --packed DIR) and decode every frame; report counts",
"      --list L | --packed DIR, --root R, --tmpl T, --skip-bad, --min-frames N\n",
     cmd_check},
    {"extract", "decode a list of video files into TSM frame folders (or packed shards)",
"      --list L           video list: 'path label' per line (any container FFmpeg reads)\n"
"      --root R           directory the paths are relative to\n"
"      --out DIR          frame folders DIR/<path without extension>/img_%05d.jpg\n"
"                         and the TSM list DIR/<list name>.txt\n"
"      --packed DIR       or: straight into shards DIR/shard-NNNNN.{bin,idx}\n"
"      --short-side N     shorter side of the frames (default 256; 0 = as decoded)\n"
"      --fps F            frames per second (default: every frame of the video)\n"
"      --threads N        videos decoded at once (default: one per core)\n"
"      --quality Q        JPEG quality (default 95)\n"
"      --shard-videos N   --packed: videos per shard (default 256)\n"
"    Resumable: a stopped run redoes only unfinished videos (shards).  A\n"
"    video that fails is named with its list line, counted, and left out;\n"
"    exit 1 if any failed (the list of the others is written).\n",
     cmd_extract},
    {"csv-lists", "annotation CSVs (Kinetics) + class names -> lists of video files",
"      --csv F[,F...]     CSVs with a header: youtube_id, label, and time_start,\n"
"                         time_end, split when present (Kinetics' columns)\n"
"      --class-names F    class i is line i+1 (default: the labels sorted,\n"
"                         written to DIR/classes.txt)\n"
"      --root R           where the videos are; rows without a video are counted\n"
"      --out DIR          DIR/<split>.txt, 'path label' per line\n"
"      --name T           file name template under R ({id}, {start}, {end},\n"
"                         {label}, {label_}, {split}); default: the usual ones\n"
"      --ext E[,E...]     extensions tried (default mp4,webm,mkv,avi)\n",
     cmd_csv_lists},
    {"check-det", "load COCO annotations, decode every image and mask; report counts",
"      --json J           COCO annotations (instances_*.json)\n"
"      --root R           the folder of their images\n"
"      --skip-bad         skip bad records (counted in skipped_records) instead of failing\n"
"    Malformed records (segmentations included) are errors naming the file, the\n"
"    record and its id; an unreadable image, or one of another size than the\n"
"    JSON says, is reported and makes the exit status 1.\n",
     cmd_check_det},
};
enum { NCOMMANDS = sizeof COMMANDS / sizeof COMMANDS[0] };

static void usage(FILE *f)
{
    fputs("usage: psdata COMMAND [options]\n\n", f);
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-11s %s\n%s\n", COMMANDS[i].name, COMMANDS[i].help, COMMANDS[i].options);
    fputs("  --help      this text\n", f);
}

static const struct command *find_command(const char *name)
{
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(COMMANDS[i].name, name)) return &COMMANDS[i];
    return NULL;
}

static void unknown_command(const char *name)
{
    fprintf(stderr, "psdata: unknown command '%s' (", name);
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(stderr, "%s%s", i ? ", " : "", COMMANDS[i].name);
    fputs("; --help)\n", stderr);
}

enum { O_OUT = 256, O_VIDEOS, O_FRAMES, O_SIZE, O_SEED, O_CLASSES, O_VALF, O_QUALITY, O_SPEED,
       O_CLUTTER, O_MOVERS, O_LIST, O_ROOT, O_TMPL, O_SHARD, O_SKIP, O_PACKED, O_MINF, O_HELP,
       O_IMAGES, O_VALIMG, O_MINOBJ, O_MAXOBJ, O_MINSZ, O_MAXSZ, O_CONTAINER, O_FPS, O_GOP,
       O_THREADS, O_SHORT, O_CSV, O_CNAMES, O_NAME, O_EXT, O_BFRAMES, O_MASKS, O_JSON };

static const struct option OPTS[] = {
    { "out", 1, 0, O_OUT }, { "videos", 1, 0, O_VIDEOS }, { "frames", 1, 0, O_FRAMES },
    { "size", 1, 0, O_SIZE }, { "seed", 1, 0, O_SEED }, { "classes", 1, 0, O_CLASSES },
    { "val-fraction", 1, 0, O_VALF }, { "quality", 1, 0, O_QUALITY }, { "speed", 1, 0, O_SPEED },
    { "clutter", 1, 0, O_CLUTTER }, { "movers", 1, 0, O_MOVERS }, { "list", 1, 0, O_LIST },
    { "root", 1, 0, O_ROOT }, { "tmpl", 1, 0, O_TMPL },
    { "shard-videos", 1, 0, O_SHARD }, { "skip-bad", 0, 0, O_SKIP }, { "packed", 1, 0, O_PACKED },
    { "min-frames", 1, 0, O_MINF }, { "help", 0, 0, O_HELP },
    { "images", 1, 0, O_IMAGES }, { "val-images", 1, 0, O_VALIMG },
    { "min-objects", 1, 0, O_MINOBJ }, { "max-objects", 1, 0, O_MAXOBJ },
    { "min-size", 1, 0, O_MINSZ }, { "max-size", 1, 0, O_MAXSZ },
    { "container", 1, 0, O_CONTAINER }, { "fps", 1, 0, O_FPS }, { "gop", 1, 0, O_GOP },
    { "threads", 1, 0, O_THREADS }, { "short-side", 1, 0, O_SHORT }, { "csv", 1, 0, O_CSV },
    { "class-names", 1, 0, O_CNAMES }, { "name", 1, 0, O_NAME }, { "ext", 1, 0, O_EXT },
    { "bframes", 1, 0, O_BFRAMES }, { "masks", 0, 0, O_MASKS }, { "json", 1, 0, O_JSON },
    { 0, 0, 0, 0 }
};

static int num(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "psdata: --%s '%s': expected a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Parses argv[2..] into a: -1 to go on, else the exit code (0 after --help) */
static int parse_args(args_t *a, int argc, char **argv)
{
    double v;
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "", OPTS, NULL)) != -1) {
        switch (c) {
        case O_OUT: a->out = optarg; break;
        case O_VIDEOS: if (num("videos", optarg, 1, 1e7, &v)) return 2; a->g.videos = (int)v; break;
        case O_FRAMES: if (num("frames", optarg, 1, 1e5, &v)) return 2; a->g.frames = (int)v; break;
        case O_SIZE:
            if (num("size", optarg, 8, 4096, &v)) return 2;
            a->g.size = a->det_size = (int)v;
            break;
        case O_SEED:
            if (num("seed", optarg, 0, 1.8e19, &v)) return 2;
            a->g.seed = a->det_seed = strtoull(optarg, NULL, 10);
            break;
        case O_CLASSES:
            if (num("classes", optarg, a->is_det ? 1 : 2, a->is_det ? PS_DET_GEN_NCLASSES : 8, &v))
                return 2;
            a->g.classes = a->det_classes = (int)v;
            break;
        case O_IMAGES:
            if (num("images", optarg, 1, 1e7, &v)) return 2;
            a->det_images = (int)v;
            break;
        case O_VALIMG:
            if (num("val-images", optarg, 0, 1e7, &v)) return 2;
            a->det_val = (int)v;
            break;
        case O_MINOBJ:
            if (num("min-objects", optarg, 1, 100, &v)) return 2;
            a->det_minobj = (int)v;
            break;
        case O_MAXOBJ:
            if (num("max-objects", optarg, 1, 100, &v)) return 2;
            a->det_maxobj = (int)v;
            break;
        case O_MINSZ:
            if (num("min-size", optarg, 0.001, 0.9, &v)) return 2;
            a->det_minsz = v;
            break;
        case O_MAXSZ:
            if (num("max-size", optarg, 0.001, 0.9, &v)) return 2;
            a->det_maxsz = v;
            break;
        case O_VALF:
            if (num("val-fraction", optarg, 0, 0.99, &v)) return 2;
            a->g.val_fraction = v;
            break;
        case O_QUALITY:
            if (num("quality", optarg, 1, 100, &v)) return 2;
            a->g.quality = a->det_quality = (int)v;
            a->quality_set = 1;
            break;
        case O_SPEED: if (num("speed", optarg, 0, 1e4, &v)) return 2; a->g.speed = v; break;
        case O_CLUTTER: if (num("clutter", optarg, 0, 100, &v)) return 2; a->g.clutter = v; break;
        case O_MOVERS: if (num("movers", optarg, 0.01, 100, &v)) return 2; a->g.movers = v; break;
        case O_LIST: a->list = optarg; break;
        case O_ROOT: a->lo.root = optarg; break;
        case O_TMPL: a->lo.tmpl = optarg; break;
        case O_SHARD:
            if (num("shard-videos", optarg, 1, 1e7, &v)) return 2;
            a->shard_videos = (int)v;
            break;
        case O_SKIP: a->lo.skip_bad = 1; break;
        case O_MASKS: a->det_masks = 1; break;
        case O_JSON: a->json = optarg; break;
        case O_PACKED: a->packed = optarg; break;
        case O_MINF:
            if (num("min-frames", optarg, 1, 1e6, &v)) return 2;
            a->lo.min_frames = (int)v;
            break;
        case O_CONTAINER: a->container = optarg; break;
        case O_FPS: if (num("fps", optarg, 0, 1000, &v)) return 2; a->fps = v; break;
        case O_GOP: if (num("gop", optarg, 1, 1000, &v)) return 2; a->gop = (int)v; break;
        case O_BFRAMES: if (num("bframes", optarg, 0, 8, &v)) return 2; a->bframes = (int)v; break;
        case O_THREADS: if (num("threads", optarg, 0, 1024, &v)) return 2; a->threads = (int)v; break;
        case O_SHORT: if (num("short-side", optarg, 0, 8192, &v)) return 2; a->short_side = (int)v; break;
        case O_CSV: a->cl.csv = optarg; break;
        case O_CNAMES: a->cl.classes = optarg; break;
        case O_NAME: a->cl.name = optarg; break;
        case O_EXT: a->cl.ext = optarg; break;
        case O_HELP: usage(stdout); return 0;
        default: fprintf(stderr, "psdata: see psdata --help\n"); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "psdata: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv)
{
    ps_log_set_prog("psdata");
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    const struct command *cmd = find_command(argv[1]);
    if (!cmd) {
        unknown_command(argv[1]);
        return 2;
    }
    args_t a;
    args_init(&a, cmd->name);
    int rc = parse_args(&a, argc, argv);
    return rc >= 0 ? rc : cmd->run(&a);
}
