/* Class names and annotation CSVs.
 *
 * A class-name file has one name per line; class i is line i + 1 (TSM's
 * category.txt).  An annotation CSV (Kinetics' style) has a header naming
 * its columns, in any order: youtube_id and label are needed, time_start,
 * time_end and split are used when present (Kinetics:
 * label,youtube_id,time_start,time_end,split[,is_cc]). */
#ifndef PS_LABELS_H
#define PS_LABELS_H
#include <stddef.h>
#include <stdio.h>

typedef struct ps_class_names {
    char **name;           /* name[i]: class i */
    int n, cap;
} ps_class_names_t;

/* Reads a class-name file; a duplicate or empty name is an error naming
 * the line. */
int ps_class_names_load(const char *path, ps_class_names_t **out, char *err, size_t errlen);
/* The same, and exactly n names (a model's classes), else PS_EMISMATCH. */
int ps_class_names_load_n(const char *path, int n, ps_class_names_t **out, char *err, size_t errlen);
void ps_class_names_free(ps_class_names_t **c);
/* Writes ",\"name of class c\"" (CSV-quoted; "" for c < 0) to f. */
void ps_csv_put_name(FILE *f, const ps_class_names_t *c, int cls);
/* The index of a name, -1 if absent. */
int ps_class_names_find(const ps_class_names_t *c, const char *name);

typedef struct ps_csv_lists_opts {
    const char *csv;       /* CSV files, comma-separated (train and val share the classes) */
    const char *classes;   /* class-name file; NULL: the CSVs' labels sorted, written to out/classes.txt */
    const char *root;      /* where the videos are; only videos found there are listed */
    const char *out;       /* out/<split>.txt (split column; else the CSV's name) */
    const char *name;      /* file name template under root; NULL: try the usual ones */
    const char *ext;       /* extensions tried, comma-separated ("mp4,webm,mkv,avi") */
} ps_csv_lists_opts_t;

typedef struct ps_csv_lists_stats {
    size_t rows;           /* annotation rows read */
    size_t listed;         /* written to a list */
    size_t missing;        /* no video file found under root */
    size_t unlabelled;     /* no label (a test split): left out */
    int classes;
} ps_csv_lists_stats_t;

/* The video lists (`path label`, paths relative to root) of the CSVs.  A
 * video is found under root as the first existing of: the template (name),
 * or {id}_{start}_{end}.{ext} (start and end in whole seconds, 6 digits:
 * the Kinetics downloaders' name) and {id}.{ext}, each directly under root,
 * in {label}/, in {label_}/ (spaces as underscores), in {split}/, in
 * {split}/{label}/ and in {split}/{label_}/.  A missing video is counted
 * and logged; a label the class-name file lacks is an error naming the
 * CSV line. */
int ps_csv_to_lists(const ps_csv_lists_opts_t *o, ps_csv_lists_stats_t *st, char *err, size_t errlen);

#endif
